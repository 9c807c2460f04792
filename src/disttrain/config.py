"""JobConfig: one dataclass per section, validated in ``__post_init__``, loaded from TOML + CLI overrides.

Every field can come from a TOML file (``[train] steps = 500``) and be overridden on the command line
(``--train.steps 500``). Checks that need only one section live in that section's ``__post_init__``;
checks that need the world size (the batch arithmetic) live in :func:`resolve_batch`, called once the
launcher knows how many ranks there are. Every error is a :class:`ConfigError` whose message states the
rule, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

import torch

from disttrain.errors import ConfigError

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The dtype names the config accepts (compute, reduction, export)."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclasses.dataclass
class ModelConfig:
    """The model to train."""

    name: Literal["gpt"] = "gpt"
    """Built-in model (ignored when ``module`` is set)."""
    module: str | None = None
    """Your own model as 'pkg.mod:build', a function returning an nn.Module (called with no arguments)."""
    n_layers: int = 6
    """Transformer blocks."""
    d_model: int = 384
    """Width of the residual stream."""
    n_heads: int = 6
    """Attention heads; must divide d_model."""
    context: int = 256
    """Context length in tokens."""
    dropout: float = 0.0
    """Dropout probability."""

    def __post_init__(self) -> None:
        _check(self.n_layers >= 1, f"model.n_layers must be >= 1, got {self.n_layers}")
        _check(self.d_model >= 1, f"model.d_model must be >= 1, got {self.d_model}")
        _check(
            self.n_heads >= 1 and self.d_model % self.n_heads == 0,
            f"model.n_heads ({self.n_heads}) must divide model.d_model ({self.d_model}); "
            f"try {', '.join(str(h) for h in _divisors(self.d_model)[:6])}",
        )
        _check(self.context >= 2, f"model.context must be >= 2, got {self.context}")
        _check(0.0 <= self.dropout < 1.0, f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.module is not None:
            _check(
                ":" in self.module,
                f"model.module must look like 'pkg.mod:function', got {self.module!r}",
            )


@dataclasses.dataclass
class DataConfig:
    """Where the training samples come from."""

    path: str | None = None
    """A UTF-8 text file to train on, character-level (default: the bundled Shakespeare corpus)."""
    module: str | None = None
    """Your own dataset as 'pkg.mod:build': returns a map-style dataset of (input, target) pairs,
    or a (train, val) pair of them."""
    val_fraction: float = 0.1
    """Share of the text held out for evaluation (the tail of the corpus)."""

    def __post_init__(self) -> None:
        _check(
            0.0 < self.val_fraction < 0.5,
            f"data.val_fraction must be in (0, 0.5), got {self.val_fraction}",
        )
        _check(
            self.path is None or self.module is None,
            "set data.path or data.module, not both",
        )
        if self.module is not None:
            _check(
                ":" in self.module,
                f"data.module must look like 'pkg.mod:function', got {self.module!r}",
            )


@dataclasses.dataclass
class TrainConfig:
    """The training loop."""

    steps: int = 300
    """Optimizer steps."""
    global_batch: int = 16
    """Samples per optimizer step, over all ranks = micro_batch x accumulation x data-parallel size."""
    micro_batch: int = 8
    """Samples per forward/backward on one rank."""
    seed: int = 1234
    """Seed for initialisation and data order: same config + seed = same losses."""
    eval_interval: int = 100
    """Evaluate every N steps (0 = only at the end)."""
    eval_batches: int = 8
    """Micro-batches per rank in one evaluation."""
    generate_chars: int = 300
    """Characters of sample text printed at the end (text models only; 0 = none)."""
    skip_nonfinite: bool = True
    """Skip the optimizer step when the loss or grad norm is NaN/Inf (and count it)."""
    deterministic: bool = False
    """torch.use_deterministic_algorithms(True): slower, for bitwise reproducibility checks."""
    gc_interval: int = 50
    """Python's garbage collector: frozen after set-up and run every N steps on every rank at once, instead of
    full collections (~90 ms each here) at random moments on one rank while the others wait (0 = Python's own)."""

    def __post_init__(self) -> None:
        _check(self.steps >= 1, f"train.steps must be >= 1, got {self.steps}")
        _check(self.micro_batch >= 1, f"train.micro_batch must be >= 1, got {self.micro_batch}")
        _check(
            self.global_batch >= self.micro_batch,
            f"train.global_batch ({self.global_batch}) must be >= train.micro_batch ({self.micro_batch})",
        )
        _check(self.eval_interval >= 0, f"train.eval_interval must be >= 0, got {self.eval_interval}")
        _check(self.eval_batches >= 1, f"train.eval_batches must be >= 1, got {self.eval_batches}")
        _check(self.generate_chars >= 0, f"train.generate_chars must be >= 0, got {self.generate_chars}")
        _check(
            self.gc_interval >= 0,
            f"train.gc_interval must be >= 0 (0 = Python's automatic garbage collection), got {self.gc_interval}",
        )


@dataclasses.dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay."""

    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of the peak."""
    warmup_steps: int = 30
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay (applied to matrices only, not to biases, norms or embeddings)."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Clip the global grad norm to this (0 = no clipping; the norm is still measured)."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        _check(0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2 must be in [0, 1)")
        _check(self.grad_clip >= 0, f"optim.grad_clip must be >= 0, got {self.grad_clip}")


@dataclasses.dataclass
class ParallelConfig:
    """How the model is spread over ranks."""

    strategy: Literal["auto", "single", "ddp", "fsdp", "hsdp"] = "auto"
    """single (one process), ddp, fsdp (FSDP2), hsdp (replicate across nodes x shard within), or auto
    (from the memory plan: ddp while it fits the device, else fsdp, or hsdp across nodes)."""
    nproc: int | None = None
    """Processes on this node (default: one per GPU, or 2 on a CPU machine)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device type (auto: cuda if available)."""
    oversubscribe: bool = False
    """Allow more CPU processes than cores (for trying sharding on a laptop)."""
    replicate: int = -1
    """HSDP replica groups (-1 = the rest: world size / shard; default one per node)."""
    shard: int = -1
    """HSDP shard group size (-1 = the rest; default the ranks of one node)."""
    device_memory: str = "auto"
    """Memory of one device for the plan, e.g. '80GiB' (auto: the GPU's, or host RAM / nproc on CPU)."""
    memory_headroom: float = 0.1
    """Fraction of device memory the plan keeps free (allocator fragmentation, comm buffers)."""
    force: bool = False
    """Run a forced strategy even when the memory plan says it does not fit."""
    activation_checkpointing: str = "none"
    """Recompute block activations in backward: none, full (every block), or K (every K-th block)."""
    offload: bool = False
    """FSDP/HSDP: keep sharded params, grads and optimizer state in host memory (CPUOffloadPolicy)."""
    shard_modules: str = "auto"
    """What FSDP wraps as one unit: 'auto' (the largest ModuleList), a class name ('Block'),
    or the dotted path of a ModuleList ('transformer.h')."""
    reshard_after_forward: Literal["default", "always", "never"] = "default"
    """Free gathered params after forward: always (ZeRO-3), never (ZeRO-2),
    default (always except the last block, which backward needs at once)."""
    forward_prefetch: int = 0
    """Explicitly all-gather the next K blocks in forward (0 = FSDP's implicit one-ahead)."""
    backward_prefetch: int = 0
    """Explicitly all-gather the previous K blocks in backward (0 = implicit)."""
    ddp_bucket_mb: float = 25.0
    """DDP gradient bucket size in MiB."""
    timeout_s: float = 600.0
    """Collective timeout in seconds (a hang fails with a message after this)."""

    def __post_init__(self) -> None:
        _check(self.nproc is None or self.nproc >= 1, f"parallel.nproc must be >= 1, got {self.nproc}")
        for key in ("replicate", "shard"):
            v = getattr(self, key)
            _check(v == -1 or v >= 1, f"parallel.{key} must be >= 1, or -1 for the rest; got {v}")
        _check(
            0 <= self.memory_headroom < 1,
            f"parallel.memory_headroom must be in [0, 1), got {self.memory_headroom}; 0.1 keeps 10% free",
        )
        if self.device_memory != "auto":
            parse_bytes(self.device_memory, "parallel.device_memory")
        _check(
            not (self.offload and self.strategy in ("single", "ddp")),
            f"parallel.offload keeps FSDP's shards in host memory; it needs strategy fsdp, hsdp or auto, "
            f"not {self.strategy!r}",
        )
        ac = self.activation_checkpointing
        _check(
            ac in ("none", "full") or (ac.isdigit() and int(ac) >= 1),
            f"parallel.activation_checkpointing must be none, full, or K >= 1 (every K-th block), got {ac!r}",
        )
        _check(self.forward_prefetch >= 0, f"parallel.forward_prefetch must be >= 0, got {self.forward_prefetch}")
        _check(self.backward_prefetch >= 0, f"parallel.backward_prefetch must be >= 0, got {self.backward_prefetch}")
        _check(self.ddp_bucket_mb > 0, f"parallel.ddp_bucket_mb must be > 0, got {self.ddp_bucket_mb}")
        _check(self.timeout_s > 0, f"parallel.timeout_s must be > 0, got {self.timeout_s}")


@dataclasses.dataclass
class PrecisionConfig:
    """Mixed precision: low-precision compute, fp32 master weights and fp32 gradient reduction."""

    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Compute dtype for matmuls (params and optimizer state stay fp32); auto: bf16 where the hardware
    computes it fast (GPUs with bf16, CPUs with AMX or AVX512-BF16), else fp32."""
    reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """Gradient reduction dtype (FSDP)."""


@dataclasses.dataclass
class MetricsConfig:
    """What is measured and where it goes."""

    log_interval: int = 10
    """Log metrics every N steps."""
    progress: Literal["auto", "bar", "lines", "off"] = "auto"
    """Console: a live bar on a terminal, log lines otherwise."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one device for MFU (default: a table for known GPUs, measured on CPU)."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run folder."""

    def __post_init__(self) -> None:
        _check(self.log_interval >= 1, f"metrics.log_interval must be >= 1, got {self.log_interval}")
        _check(
            self.peak_tflops is None or self.peak_tflops > 0,
            f"metrics.peak_tflops must be > 0, got {self.peak_tflops}",
        )


@dataclasses.dataclass
class CheckpointConfig:
    """Sharded distributed checkpoints (DCP): when, how, what is kept, where to resume from."""

    folder: str = "checkpoints"
    """Checkpoint folder (relative paths are inside the run folder)."""
    interval: int = 100
    """Save every N steps (0 = only the final save)."""
    keep_latest: int = 2
    """Complete checkpoints kept (older ones are purged in the background); at least 2."""
    async_mode: Literal["off", "thread", "process"] = "thread"
    """off: the loop waits for the write; thread/process: it waits only for the copy to CPU memory."""
    save_final: Literal["full", "model_only", "none"] = "full"
    """At the end: a full checkpoint, the model weights alone (export_dtype), or nothing."""
    export_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """dtype of the model_only final save."""
    direct_io: bool = True
    """Write shard files with O_DIRECT where the file system takes it (Linux; else buffered): no page cache
    filled and then flushed; saves went from 0.33 to 0.82-0.93 of a plain write here (bench_checkpoint.py)."""
    background_nice: int = 10
    """Niceness of the background save threads (copy, write, commit, purge; Linux, per thread): they run
    when training does not need the core (0 = the same priority as training)."""
    resume: str = "auto"
    """auto (newest complete checkpoint), never, a step number, or a checkpoint path."""
    create_seed: bool = False
    """Only initialise the model on one process and save it as step 0 (a seed checkpoint that a run of any
    world size can start from with --checkpoint.resume PATH), then exit."""

    def __post_init__(self) -> None:
        _check(self.interval >= 0, f"checkpoint.interval must be >= 0, got {self.interval}")
        _check(
            self.keep_latest >= 2,
            f"checkpoint.keep_latest must be >= 2 (so a crash during a save leaves one), got {self.keep_latest}",
        )
        _check(
            self.resume in ("auto", "never") or self.resume.isdigit() or "/" in self.resume,
            f"checkpoint.resume must be auto, never, a step number or a path, got {self.resume!r}",
        )
        _check(
            0 <= self.background_nice <= 19,
            f"checkpoint.background_nice must be a niceness from 0 to 19, got {self.background_nice}",
        )


@dataclasses.dataclass
class LaunchConfig:
    """Processes, nodes and restarts (torchrun semantics)."""

    nnodes: str = "1"
    """Number of nodes, or MIN:MAX for elastic jobs."""
    node_rank: int = 0
    """This node's rank (static rendezvous)."""
    rdzv_endpoint: str | None = None
    """host:port of the rendezvous (multi-node)."""
    max_restarts: int = 0
    """Restart the whole group this many times after a failure."""

    def __post_init__(self) -> None:
        _check(self.max_restarts >= 0, f"launch.max_restarts must be >= 0, got {self.max_restarts}")
        parts = self.nnodes.split(":")
        _check(
            1 <= len(parts) <= 2 and all(p.isdigit() and int(p) >= 1 for p in parts),
            f"launch.nnodes must be N or MIN:MAX with N >= 1, got {self.nnodes!r}",
        )


@dataclasses.dataclass
class RunConfig:
    """Where the run folder goes."""

    name: str | None = None
    """Run folder name (default: date-time-strategy)."""
    root: str = "runs"
    """Parent folder of run folders."""


@dataclasses.dataclass
class HealthConfig:
    """Heartbeats, hang watchdog, stragglers, bad-step guards and debug presets (see disttrain.health)."""

    enabled: bool = True
    """Heartbeats, the hang watchdog and straggler detection (the bad-step guards below work either way)."""
    heartbeat_s: float = 2.0
    """Seconds between heartbeats: each rank's step and phase, sent to the rendezvous store by a thread."""
    hang_timeout_s: float | None = None
    """A rank making no progress this long is hung (default: max(hang_floor_s, hang_factor x median step))."""
    hang_factor: float = 5.0
    """Automatic hang timeout, in median step times."""
    hang_floor_s: float = 60.0
    """The automatic hang timeout is never shorter than this."""
    startup_timeout_s: float = 600.0
    """Collective timeout and hang limit until the first step is done, and during eval and checkpoints
    (afterwards collectives use parallel.timeout_s)."""
    straggler_interval: int = 50
    """Compare every rank's step (compute) and data-loading times every N steps (0 = off)."""
    straggler_factor: float = 1.5
    """A rank slower than the median of the others by this factor is named a straggler."""
    spike_rtol: float = 1.0
    """Skip a step whose loss exceeds the median of the last spike_window good losses by this relative
    margin (1.0: twice the median; 0 = off). NaN/Inf loss or grad norm: see train.skip_nonfinite."""
    spike_window: int = 50
    """Good steps in the rolling window of the spike guard."""
    max_bad_steps: int = 5
    """After this many bad (skipped) steps in a row, do what on_bad_steps says."""
    on_bad_steps: Literal["rollback", "stop", "continue"] = "rollback"
    """rollback: reload the last checkpoint (skipping the data since) and go on; stop: exit with a message."""
    rollback_lr_factor: float = 1.0
    """Multiply the learning rate by this at each rollback (e.g. 0.5)."""
    max_rollbacks: int = 3
    """Stop after this many rollbacks in one attempt."""
    debug: str = "off"
    """Debug presets, comma-separated: comms (TORCH_DISTRIBUTED_DEBUG=DETAIL, gloo/NCCL logs, NCCL flight
    recorder), anomaly (autograd anomaly detection); or off."""

    def __post_init__(self) -> None:
        _check(self.heartbeat_s > 0, f"health.heartbeat_s must be > 0, got {self.heartbeat_s}")
        _check(
            self.hang_timeout_s is None or self.hang_timeout_s > 2 * self.heartbeat_s,
            f"health.hang_timeout_s ({self.hang_timeout_s}) must be > 2 x health.heartbeat_s ({self.heartbeat_s}); "
            "raise it or lower --health.heartbeat-s",
        )
        for key in ("hang_factor", "hang_floor_s", "startup_timeout_s", "straggler_factor", "rollback_lr_factor"):
            _check(getattr(self, key) > 0, f"health.{key} must be > 0, got {getattr(self, key)}")
        _check(self.straggler_factor > 1, f"health.straggler_factor must be > 1, got {self.straggler_factor}")
        _check(self.straggler_interval >= 0, f"health.straggler_interval must be >= 0, got {self.straggler_interval}")
        _check(self.spike_rtol >= 0, f"health.spike_rtol must be >= 0 (0 = off), got {self.spike_rtol}")
        _check(self.spike_window >= 2, f"health.spike_window must be >= 2, got {self.spike_window}")
        _check(self.max_bad_steps >= 1, f"health.max_bad_steps must be >= 1, got {self.max_bad_steps}")
        _check(self.max_rollbacks >= 0, f"health.max_rollbacks must be >= 0, got {self.max_rollbacks}")
        bad = sorted(self.debug_presets - {"comms", "anomaly"})
        _check(not bad, f"health.debug: unknown preset(s) {bad}; use comms, anomaly, 'comms,anomaly' or off")

    @property
    def debug_presets(self) -> set[str]:
        return {p.strip() for p in self.debug.split(",") if p.strip() and p.strip() != "off"}


@dataclasses.dataclass
class JobConfig:
    """Everything a training job needs; ``disttrain run --print-config`` shows the resolved one."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    precision: PrecisionConfig = dataclasses.field(default_factory=PrecisionConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    launch: LaunchConfig = dataclasses.field(default_factory=LaunchConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}  # fmt: skip


def parse_bytes(text: str, what: str = "memory size") -> int:
    """'80GiB', '512MB', '1.5T', '1000000' -> bytes; ConfigError saying the accepted forms otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(
            f"{what}: cannot read {text!r} as a size; write a number and a unit, e.g. 80GiB, 24GB, 512MiB"
        )
    return int(float(m.group(1)) * _UNITS[unit])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(choices))}"


def section_types() -> dict[str, type]:
    """Section name -> dataclass type, in declaration order."""
    hints = typing.get_type_hints(JobConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(JobConfig)}


def known_keys() -> list[str]:
    """Every dotted key a user may set ('train.steps', ...)."""
    return [f"{s}.{f.name}" for s, t in section_types().items() for f in dataclasses.fields(t)]


def from_dict(raw: dict[str, Any], source: str = "config") -> JobConfig:
    """Build a JobConfig from nested dicts (TOML layout); unknown keys are errors naming the closest key."""
    sections = section_types()
    kwargs: dict[str, Any] = {}
    for sec, body in raw.items():
        if sec not in sections:
            raise ConfigError(f"{source}: unknown section [{sec}]{_suggest(sec, list(sections))}")
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: [{sec}] must be a table, got {type(body).__name__}")
        fields = {f.name for f in dataclasses.fields(sections[sec])}
        for key in body:
            if key not in fields:
                raise ConfigError(f"{source}: unknown key {sec}.{key}{_suggest(f'{sec}.{key}', known_keys())}")
        try:
            kwargs[sec] = sections[sec](**body)
        except TypeError as e:  # wrong value types surface here only in odd cases
            raise ConfigError(f"{source}: [{sec}]: {e}") from None
    return JobConfig(**kwargs)


def load_toml(path: str | Path) -> JobConfig:
    """Read a TOML job file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass a path to a .toml file")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    return from_dict(raw, source=str(p))


def to_dict(cfg: JobConfig) -> dict[str, dict[str, Any]]:
    """Nested dict of the config (TOML layout)."""
    return dataclasses.asdict(cfg)


def to_toml(cfg: JobConfig) -> str:
    """Serialise to TOML (None values are omitted: they mean 'default')."""
    lines: list[str] = []
    for sec, body in to_dict(cfg).items():
        lines.append(f"[{sec}]")
        for key, val in body.items():
            if val is not None:
                lines.append(f"{key} = {_toml_value(val)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} to TOML")


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic for one world size: global = micro x accum x dp."""

    global_batch: int
    micro_batch: int
    dp_size: int
    accum_steps: int


def resolve_batch(train: TrainConfig, dp_size: int) -> BatchPlan:
    """Derive gradient-accumulation steps for ``dp_size`` data-parallel ranks, or explain why it can't."""
    per_step = train.micro_batch * dp_size
    if train.global_batch % per_step:
        lo = max(per_step, train.global_batch // per_step * per_step)
        raise ConfigError(
            f"train.global_batch ({train.global_batch}) must be a multiple of train.micro_batch "
            f"({train.micro_batch}) x data-parallel size ({dp_size}) = {per_step}; "
            f"try --train.global_batch {lo} or {lo + per_step}"
        )
    return BatchPlan(train.global_batch, train.micro_batch, dp_size, train.global_batch // per_step)


def _flag_key(token: str) -> str | None:
    """'--train.global-batch=4' -> 'train.global_batch'; None for tokens that are not dotted options."""
    if not token.startswith("--") or "." not in token:
        return None
    key = token[2:].split("=", 1)[0].replace("-", "_")
    sec, _, name = key.partition(".")
    return f"{sec}.{name}"


def check_override_keys(argv: list[str]) -> None:
    """Reject unknown ``--section.key`` options up front, naming the closest known one."""
    keys = set(known_keys())
    for tok in argv:
        key = _flag_key(tok)
        if key is None:
            if tok.startswith("--") and tok not in ("--help", "-h"):
                raise ConfigError(f"unknown option {tok}: options look like --section.key (e.g. --train.steps 500)")
            continue
        sec, _, name = key.partition(".")
        if key in keys or (name.startswith("no_") and f"{sec}.{name[3:]}" in keys):
            continue
        flag = tok.split("=", 1)[0]
        close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.5)
        hint = f"; did you mean --{close[0]}?" if close else "; see `disttrain run --help`"
        raise ConfigError(f"unknown option {flag}{hint}")


def _one_line(captured: str) -> str:
    """Squeeze tyro's boxed error message into one line (the text before its first separator)."""
    lines: list[str] = []
    for raw in captured.splitlines():
        text = raw.strip().strip("│╭╮╰╯─ ").strip()
        if "────" in raw and lines:
            break
        if text and not text.startswith(("For full helptext", "usage:")):
            lines.append(text)
    return " ".join(lines).replace("Error parsing ", "") or "invalid command-line options"


def apply_overrides(base: JobConfig, argv: list[str], prog: str = "disttrain run") -> JobConfig:
    """Apply ``--section.key value`` overrides to ``base`` (tyro does the typing and the help text)."""
    import contextlib
    import io

    import tyro

    check_override_keys(argv)
    if any(a in ("-h", "--help") for a in argv):
        return tyro.cli(JobConfig, default=base, args=argv, prog=prog)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            return tyro.cli(JobConfig, default=base, args=argv, prog=prog)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        raise ConfigError(_one_line(err.getvalue())) from None
    except ConfigError:
        raise
    except ValueError as e:  # a __post_init__ check, raised while tyro builds the dataclass
        raise ConfigError(str(e)) from None
