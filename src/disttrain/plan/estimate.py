"""The memory plan: bytes per rank for each strategy, the strategy ``auto`` picks, and why.

Two steps. :func:`profile_model` looks at the model once, on the meta device (no memory, no compute,
so a 70B-parameter config takes seconds): the shape of every parameter and which FSDP unit (block or
root) owns it, and the activations autograd saves for one micro-batch, per block. :func:`estimate` then
turns that profile into a per-rank plan for DDP, FSDP (reshard after forward, ZeRO-3-like), FSDP
without reshard (ZeRO-2-like), HSDP and FSDP with CPU offload, with the exact byte arithmetic of what
torch allocates:

- parameters: fp32 master weights; FSDP2 shards dim 0 of every parameter into ``ceil(d0 / N)`` rows per
  rank (padded, so uneven shards round up);
- gradients: fp32, one per trainable parameter, sharded like the parameters (DDP: its gradient buckets,
  which the gradients are views of);
- optimizer: AdamW's two fp32 moments per element plus a 4-byte step per parameter tensor;
- gathered: what FSDP all-gathers transiently in the compute dtype (the root unit, the current block and
  the prefetched ones, plus one block's unsharded gradient), or every unit when it does not reshard after
  forward; for DDP under autocast, the low-precision copies of the weights;
- activations: saved tensors of one micro-batch in the compute dtype, plus the largest of them once more
  (its gradient, at the start of backward); with activation checkpointing, only the inputs of the
  checkpointed blocks plus one block recomputed.

The total is the sum, an upper bound: gradients and activations overlap only partly in backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from disttrain.config import DTYPES, JobConfig, parse_bytes
from disttrain.errors import ConfigError
from disttrain.utils.fmt import fmt_bytes

GiB = 2**30
COLUMNS = ("ddp", "fsdp", "fsdp_no_reshard", "hsdp", "fsdp_offload")
LABELS = {
    "ddp": "DDP",
    "fsdp": "FSDP",
    "fsdp_no_reshard": "FSDP no-reshard",
    "hsdp": "HSDP",
    "fsdp_offload": "FSDP+offload",
}
ROWS = ("params", "grads", "optimizer", "gathered", "activations", "total")
ADAM_BYTES_PER_ELEMENT = 8  # exp_avg + exp_avg_sq in fp32
ADAM_STEP_BYTES = 4  # one fp32 step tensor per parameter


@dataclass(frozen=True)
class ParamInfo:
    shape: tuple[int, ...]
    unit: int
    """Index of the FSDP block that owns it, or -1 for the root (embeddings, final norm, head)."""
    trainable: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def shard_numel(self, n: int) -> int:
        """Elements one rank holds when sharded ``n`` ways: FSDP2 pads dim 0 to a multiple of n."""
        if n <= 1 or not self.shape:
            return self.numel
        return math.ceil(self.shape[0] / n) * (self.numel // self.shape[0])


@dataclass(frozen=True)
class ModelProfile:
    """What the plan needs to know about a model, measured once on the meta device."""

    params: tuple[ParamInfo, ...]
    n_blocks: int
    act_by_block: tuple[int, ...]
    """Bytes autograd saves inside each block for one micro-batch (compute dtype)."""
    act_other: int
    """Bytes saved outside the blocks (embeddings, head, loss)."""
    block_input_bytes: tuple[int, ...]
    """Bytes of each block's input: what a checkpointed block keeps."""
    largest_act: int
    micro_batch: int
    compute_dtype: str
    attention: str = "math"
    """How ``scaled_dot_product_attention`` was accounted: ``math`` (saves the T x T probabilities, as
    CPU and the meta device do) or ``flash`` (saves q, k, v, the output and the log-sum-exp: CUDA)."""

    @property
    def n_params(self) -> int:
        return sum(p.numel for p in self.params)

    def activations(self, ac: str = "none") -> int:
        """Peak activation bytes with activation checkpointing ``none``, ``full`` or every K-th block."""
        total = self.act_other + sum(self.act_by_block) + self.largest_act
        if ac == "none" or not self.n_blocks:
            return total
        k = 1 if ac == "full" else int(ac)
        ckpt = [i for i in range(self.n_blocks) if i % k == 0]
        saved = self.act_other + sum(a for i, a in enumerate(self.act_by_block) if i % k)
        saved += sum(self.block_input_bytes[i] for i in ckpt)
        return saved + max(self.act_by_block[i] for i in ckpt) + self.largest_act


def _meta_like(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    dt = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return torch.empty(t.shape, dtype=dt, device="meta", requires_grad=t.requires_grad)


def _batch(sample: Any, micro_batch: int) -> Any:
    if isinstance(sample, torch.Tensor):
        return torch.empty((micro_batch, *sample.shape), dtype=sample.dtype, device="meta")
    if isinstance(sample, (tuple, list)):
        return type(sample)(_batch(s, micro_batch) for s in sample)
    if isinstance(sample, dict):
        return {k: _batch(v, micro_batch) for k, v in sample.items()}
    return sample


def profile_model(
    model: nn.Module,
    sample: tuple[Any, Any],
    *,
    micro_batch: int,
    compute_dtype: str = "fp32",
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    shard_modules: str = "auto",
    attention: str = "math",
) -> ModelProfile:
    """Profile ``model`` (on any device, or meta) for one micro-batch of ``sample`` = one dataset item.

    The forward runs through ``torch.func.functional_call`` with meta stand-ins for every parameter and
    buffer: nothing is allocated or computed, and the model itself is not touched. ``attention="flash"``
    accounts ``F.scaled_dot_product_attention`` as CUDA's flash / memory-efficient kernels run it (O(T)
    saved per head) instead of the math path the meta device takes (the T x T probabilities).
    """
    from torch.func import functional_call

    from disttrain.dist.fsdp import find_blocks
    from disttrain.train.loss import cross_entropy

    blocks = find_blocks(model, shard_modules)
    owner: dict[int, int] = {}
    for i, b in enumerate(blocks):
        for p in b.parameters():
            owner.setdefault(id(p), i)
    params = tuple(ParamInfo(tuple(p.shape), owner.get(id(p), -1), p.requires_grad) for p in model.parameters())

    cdt = DTYPES[compute_dtype]
    stand_ins = {n: _meta_like(t, cdt) for n, t in model.named_parameters(remove_duplicate=False)}
    stand_ins.update({n: _meta_like(t, None) for n, t in model.named_buffers(remove_duplicate=False)})
    param_storages = {t.untyped_storage()._cdata for t in stand_ins.values()}
    current = [-1]
    block_in = [0] * len(blocks)
    saved: dict[int, tuple[int, int]] = {}
    keep: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in saved and key not in param_storages:
            saved[key] = (t.untyped_storage().nbytes(), current[0])
            keep.append(t)  # the storage must outlive the profile, so that its address is not reused
        return t

    def enter(i: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            current[0] = i
            if args and isinstance(args[0], torch.Tensor):
                block_in[i] = args[0].numel() * args[0].element_size()

        return hook

    def leave(_m: nn.Module, _a: Any, _o: Any) -> None:
        current[0] = -1

    handles = [h for i, b in enumerate(blocks) for h in (b.register_forward_pre_hook(enter(i)),
               b.register_forward_hook(leave))]  # fmt: skip
    x, y = _batch(sample[0], micro_batch), _batch(sample[1], micro_batch)
    kernels = _FlashAttentionSaves() if attention == "flash" else contextlib.nullcontext()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), kernels:
            out = functional_call(model, stand_ins, (x,))
            (loss_fn or cross_entropy)(out, y)
    except Exception as e:  # a model whose forward cannot run on meta tensors
        raise ConfigError(
            f"cannot profile the model on the meta device ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "the memory plan needs a forward that runs on meta tensors (no .item(), no data-dependent shapes); "
            "force a strategy with --parallel.strategy ddp|fsdp"
        ) from None
    finally:
        for h in handles:
            h.remove()
    by_block = [0] * len(blocks)
    other = 0
    for nbytes, where in saved.values():
        if where >= 0:
            by_block[where] += nbytes
        else:
            other += nbytes
    largest = max((b for b, _ in saved.values()), default=0)
    return ModelProfile(params, len(blocks), tuple(by_block), other, tuple(block_in), largest, micro_batch,
                        compute_dtype, attention)  # fmt: skip


class _FlashSaves(torch.autograd.Function):
    """Meta stand-in for a fused attention kernel: the output's shape, and what its backward keeps."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)  # the log-sum-exp per query row
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # pragma: no cover - the profile never runs backward
        raise NotImplementedError


class _FlashAttentionSaves(torch.overrides.TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to :class:`_FlashSaves` while profiling for CUDA. A mask
    given as a tensor is an input the graph already holds, so it adds nothing here either."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k, v = (args[i] if i < len(args) else kwargs[n] for i, n in enumerate(("query", "key", "value")))
            return _FlashSaves.apply(q, k, v)
        return func(*args, **kwargs)


def local_device(cfg: JobConfig) -> str:
    """The device type a job configured so runs on here: CUDA unless ``parallel.device`` is cpu or there is none."""
    return "cuda" if cfg.parallel.device != "cpu" and torch.cuda.is_available() else "cpu"


def attention_for(device_type: str) -> str:
    """How the profile accounts fused attention on ``device_type`` (see :func:`profile_model`)."""
    return "flash" if device_type == "cuda" else "math"


def target_device(cfg: JobConfig) -> str:
    """The device type the plan is for: ``parallel.device`` when set, else CUDA if this machine has it. A laptop
    planning for GPUs says ``--parallel.device cuda``."""
    if cfg.parallel.device != "auto":
        return cfg.parallel.device
    return "cuda" if torch.cuda.is_available() else "cpu"


# -- the plan ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where the job runs: ranks per node, nodes, and one device's memory."""

    nproc: int
    nnodes: int = 1
    device_memory: int = 80 * GiB
    headroom: float = 0.1

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def budget(self) -> int:
        """Bytes the plan may use per device."""
        return int(self.device_memory * (1 - self.headroom))


@dataclass(frozen=True)
class StrategyPlan:
    """Bytes per rank (device) for one strategy; ``host`` is what CPU offload keeps in host memory."""

    name: str
    shard: int
    params: int
    grads: int
    optimizer: int
    gathered: int
    activations: int
    host: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations

    def row(self, key: str) -> int:
        return int(getattr(self, key))


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    profile: ModelProfile
    ac: str
    plans: dict[str, StrategyPlan]
    activations_alt: int
    """Activation bytes with the other activation-checkpointing choice (full if none is configured)."""
    ac_alt: str
    choice: str = ""
    reason: str = ""
    fits: dict[str, bool] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": dataclasses.asdict(self.layout) | {"world": self.layout.world, "budget": self.layout.budget},
            "n_params": self.profile.n_params,
            "attention": self.profile.attention,
            "activation_checkpointing": self.ac,
            "activations_alt": {"activation_checkpointing": self.ac_alt, "bytes": self.activations_alt},
            "strategies": {
                k: dataclasses.asdict(p) | {"total": p.total, "fits": self.fits[k]} for k, p in self.plans.items()
            },
            "recommendation": {"strategy": self.choice, "reason": self.reason},
        }


def sharded_bytes(params: tuple[ParamInfo, ...], n: int, nbytes: int, trainable_only: bool = False) -> int:
    return sum(p.shard_numel(n) * nbytes for p in params if p.trainable or not trainable_only)


def _unit_bytes(params: tuple[ParamInfo, ...], unit: int, n: int, nbytes: int) -> int:
    """Unsharded (all-gathered, padded) bytes of one FSDP unit."""
    return sum(p.shard_numel(n) * n * nbytes for p in params if p.unit == unit)


def _sharded_plan(name: str, prof: ModelProfile, n: int, cfg: JobConfig, act: int, reshard: bool) -> StrategyPlan:
    cb = DTYPES[cfg.precision.dtype].itemsize
    rb = DTYPES[cfg.precision.reduce_dtype].itemsize
    ps = prof.params
    blocks = [_unit_bytes(ps, i, n, 1) for i in range(prof.n_blocks)]
    biggest = max(blocks, default=0)
    root = _unit_bytes(ps, -1, n, 1)
    grad_unsharded = biggest * (cb + (rb if rb != cb else 0))  # computed in the compute dtype, reduced in rb
    if reshard:
        depth = 1 + max(cfg.parallel.forward_prefetch, cfg.parallel.backward_prefetch, 1)
        gathered = (root + depth * biggest) * cb + grad_unsharded
    else:
        gathered = (root + sum(blocks)) * cb + grad_unsharded
    if not prof.n_blocks:  # one unit: the whole model
        gathered = root * cb + root * (cb + (rb if rb != cb else 0))
    params = sharded_bytes(ps, n, 4)
    grads = sharded_bytes(ps, n, 4, trainable_only=True)
    optim = sharded_bytes(ps, n, ADAM_BYTES_PER_ELEMENT, True) + ADAM_STEP_BYTES * sum(p.trainable for p in ps)
    if name == "fsdp_offload":
        return StrategyPlan(name, n, 0, 0, 0, gathered, act, host=params + grads + optim)
    return StrategyPlan(name, n, params, grads, optim, gathered, act)


def estimate(prof: ModelProfile, cfg: JobConfig, layout: Layout) -> Estimate:
    """Per-rank plans for every strategy at ``layout``, and the recommendation."""
    cfg = resolved_precision(cfg)
    ac = cfg.parallel.activation_checkpointing
    act = prof.activations(ac)
    ac_alt = "full" if ac == "none" else "none"
    ps = prof.params
    cb = DTYPES[cfg.precision.dtype].itemsize
    w = layout.world
    low_precision_copies = sum(p.numel * cb for p in ps if len(p.shape) >= 2) if cb < 4 else 0
    plans = {
        "ddp": StrategyPlan(
            "ddp",
            1,
            sharded_bytes(ps, 1, 4),
            sharded_bytes(ps, 1, 4, trainable_only=True),
            sharded_bytes(ps, 1, ADAM_BYTES_PER_ELEMENT, True) + ADAM_STEP_BYTES * sum(p.trainable for p in ps),
            low_precision_copies,
            act,
        ),
        "fsdp": _sharded_plan("fsdp", prof, w, cfg, act, reshard=True),
        "fsdp_no_reshard": _sharded_plan("fsdp_no_reshard", prof, w, cfg, act, reshard=False),
        "hsdp": _sharded_plan("hsdp", prof, layout.nproc, cfg, act, reshard=True),
        "fsdp_offload": _sharded_plan("fsdp_offload", prof, w, cfg, act, reshard=True),
    }
    fits = {k: p.total <= layout.budget for k, p in plans.items()}
    est = Estimate(layout, prof, ac, plans, prof.activations(ac_alt), ac_alt, fits=fits)
    choice, reason = recommend(est)
    return dataclasses.replace(est, choice=choice, reason=reason)


def recommend(est: Estimate) -> tuple[str, str]:
    """The strategy ``auto`` runs, and why, in one sentence."""
    lay, p = est.layout, est.plans
    usable = f"{fmt_bytes(lay.budget)} usable per device ({fmt_bytes(lay.device_memory)} less {lay.headroom:.0%})"
    ddp = f"DDP needs {fmt_bytes(p['ddp'].total)} per rank"
    if lay.world == 1:
        verdict = "fits" if est.fits["ddp"] else "does NOT fit"
        return "single", f"one process: the model {verdict} ({fmt_bytes(p['ddp'].total)} of {usable})"
    if est.fits["ddp"]:
        return "ddp", f"{ddp} of {usable}: it fits, and DDP communicates least (one gradient all-reduce per step)"
    if lay.nnodes > 1 and lay.nproc > 1 and est.fits["hsdp"]:
        return "hsdp", (
            f"{ddp}, more than the {usable}; one node holds a replica sharded {lay.nproc} ways "
            f"({fmt_bytes(p['hsdp'].total)} per rank), so HSDP keeps all-gathers inside a node and only "
            "all-reduces gradients across nodes"
        )
    if est.fits["fsdp"]:
        return "fsdp", (
            f"{ddp}, more than the {usable}; FSDP over {lay.world} ranks needs {fmt_bytes(p['fsdp'].total)}"
        )
    return "fsdp", f"nothing fits: {ddp} and FSDP {fmt_bytes(p['fsdp'].total)}, but only {usable}"


def advice(est: Estimate, prof: ModelProfile, cfg: JobConfig) -> str:
    """What would make FSDP fit: activation checkpointing, offload, more ranks."""
    tips = []
    if est.ac == "none":
        alt = estimate(prof, with_parallel(cfg, activation_checkpointing="full"), est.layout).plans["fsdp"]
        tips.append(f"--parallel.activation_checkpointing full (FSDP then needs {fmt_bytes(alt.total)})")
    tips.append(f"--parallel.offload ({fmt_bytes(est.plans['fsdp_offload'].total)} on the device)")
    tips.append("more ranks, a smaller micro-batch, or --parallel.force to try anyway")
    return "; ".join(tips)


def with_parallel(cfg: JobConfig, **parallel: Any) -> JobConfig:
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **parallel))


def column_for(strategy: str, cfg: JobConfig) -> str:
    """The plan column that describes what ``strategy`` with this config will run."""
    if strategy in ("single", "ddp"):
        return "ddp"
    if cfg.parallel.offload:
        return "fsdp_offload"
    if strategy == "hsdp":
        return "hsdp"
    return "fsdp_no_reshard" if cfg.parallel.reshard_after_forward == "never" else "fsdp"


def render(est: Estimate) -> str:
    """The per-rank table as text, then the recommendation."""
    lay = est.layout
    cols = list(COLUMNS)
    head = ["per rank", *(LABELS[c] for c in cols)]
    shard_row = ["shard degree", *(str(est.plans[c].shard) for c in cols)]
    rows = [shard_row]
    names = {
        "params": "parameters (fp32)",
        "grads": "gradients (fp32)",
        "optimizer": "optimizer (AdamW)",
        "gathered": "gathered / low-prec copies",
        "activations": f"activations (AC {est.ac})",
    }
    for key in ROWS[:-1]:
        rows.append([names[key], *(fmt_bytes(est.plans[c].row(key)) for c in cols)])
    rows.append([f"activations (AC {est.ac_alt})", *(fmt_bytes(est.activations_alt) for _ in cols)])
    rows.append(["host memory (offload)", *(fmt_bytes(est.plans[c].host) if est.plans[c].host else "-" for c in cols)])
    rows.append(["total peak", *(fmt_bytes(est.plans[c].total) for c in cols)])
    rows.append([f"fits {fmt_bytes(lay.budget)}?", *("yes" if est.fits[c] else "NO" for c in cols)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    out = [
        f"memory plan per rank: {est.profile.n_params / 1e6:,.1f}M parameters, {lay.nproc} rank(s) x "
        f"{lay.nnodes} node(s), micro-batch {est.profile.micro_batch}, {est.profile.compute_dtype} compute, "
        f"{est.profile.attention} attention, "
        f"device memory {fmt_bytes(lay.device_memory)} - {lay.headroom:.0%} headroom",
        _line(head, widths),
        line,
    ]
    for r in rows:
        out.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
    out.append(f"recommended: {est.choice} — {est.reason}")
    return "\n".join(out)


def _line(cells: list[str], widths: list[int]) -> str:
    """First cell left-aligned, the others right-aligned."""
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def resolve_device_memory(spec: str, device_type: str, nproc: int) -> int:
    """'auto' -> the GPU's total memory, or host RAM / nproc on CPU; else the parsed size."""
    if spec != "auto":
        return parse_bytes(spec, "parallel.device_memory")
    if device_type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    import psutil

    return int(psutil.virtual_memory().total // max(nproc, 1))


def resolved_precision(cfg: JobConfig, device_type: str | None = None) -> JobConfig:
    """``precision.dtype = "auto"`` decided for ``device_type`` (default: cuda if present, else cpu)."""
    from disttrain.dist.env import resolve_precision

    if cfg.precision.dtype != "auto":
        return cfg
    device_type = device_type or local_device(cfg)
    return dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device_type))


def plan_job(cfg: JobConfig, layout: Layout, loss_fn: Callable[[Any, Any], torch.Tensor] | None = None) -> Estimate:
    """Build the configured model on the meta device, profile it, and estimate every strategy."""
    device = target_device(cfg)
    cfg = resolved_precision(cfg, device)
    from disttrain.build import build_data, build_model, vocab_size

    train, _, text = build_data(cfg)
    vocab = vocab_size(train, text)
    model = build_model(cfg, vocab, on_meta=True)
    prof = profile_model(
        model,
        train[0],
        micro_batch=cfg.train.micro_batch,
        compute_dtype=cfg.precision.dtype,
        shard_modules=cfg.parallel.shard_modules,
        attention=attention_for(device),
        loss_fn=loss_fn,
    )
    return estimate(prof, cfg, layout)


def decide(cfg: JobConfig, est: Estimate) -> tuple[str, str]:
    """The strategy to run and why: the recommendation for 'auto', else the forced one if it fits.

    ConfigError when the strategy that would run does not fit and ``parallel.force`` is off.
    """
    lay, strategy = est.layout, cfg.parallel.strategy
    if strategy == "auto":
        choice, reason = est.choice, f"auto: {est.reason}"
        if cfg.parallel.offload and choice in ("single", "ddp"):
            choice = "hsdp" if lay.nnodes > 1 and lay.nproc > 1 else "fsdp"
            reason = "auto: parallel.offload is set, and offloading needs sharded parameters"
    else:
        choice, reason = strategy, "forced by parallel.strategy"
    plan = est.plans[column_for(choice, cfg)]
    if plan.total > lay.budget and not cfg.parallel.force:
        what = "no strategy fits" if strategy == "auto" else f"strategy {choice!r} does not fit"
        prof = est.profile
        raise ConfigError(
            f"{what}: {LABELS[column_for(choice, cfg)]} needs {fmt_bytes(plan.total)} per rank, more than the "
            f"{fmt_bytes(lay.budget)} usable ({fmt_bytes(lay.device_memory)} device memory less "
            f"{lay.headroom:.0%} headroom).\n{render(est)}\n"
            f"To fix: {advice(est, prof, cfg)}"
        )
    fit = f"{LABELS[column_for(choice, cfg)]} plan {fmt_bytes(plan.total)} of {fmt_bytes(lay.budget)} usable"
    return choice, reason if strategy == "auto" else f"{reason} ({fit})"


def auto_strategy(
    model: nn.Module,
    sample: tuple[Any, Any],
    cfg: JobConfig,
    world: int,
    local: int,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
) -> tuple[str, str]:
    """'auto' for a model already in hand (the Python API): plan it where it runs, then :func:`decide`.

    A model the planner cannot run on meta tensors gets the plain default (DDP), with the reason saying so.
    """
    from disttrain.dist.mesh import resolve_strategy

    device_type = local_device(cfg)
    local = max(1, min(local, world))
    layout = Layout(
        local,
        max(world // local, 1),
        resolve_device_memory(cfg.parallel.device_memory, device_type, local),
        cfg.parallel.memory_headroom,
    )
    cfg = resolved_precision(cfg, device_type)
    try:
        prof = profile_model(
            model, sample, micro_batch=cfg.train.micro_batch, compute_dtype=cfg.precision.dtype,
            loss_fn=loss_fn, shard_modules=cfg.parallel.shard_modules,
            attention=attention_for(device_type),
        )  # fmt: skip
    except ConfigError as e:
        return resolve_strategy("auto", world), f"auto without a memory plan ({e})"
    return decide(cfg, estimate(prof, cfg, layout))
