"""What is trained and how: the model, the data, the loop, the optimizer, precision and metrics sections."""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from disttrain.config.values import check, divisors


@dataclasses.dataclass
class ModelConfig:
    """The model to train."""

    name: Literal["gpt"] = "gpt"
    """Built-in model (ignored when ``module`` is set)."""
    module: str | None = None
    """Your own model as 'pkg.mod:build' (importable, or a module in the current folder) or 'path/to/file.py:build':
    a function returning an nn.Module (called with no arguments)."""
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
    loss: Literal["cross_entropy", "model"] = "cross_entropy"
    """cross_entropy (ours, over the logits the model returns) or model (the model's own loss: it is
    called with ``labels=`` and returns ``loss``, as Hugging Face models do)."""
    labels: Literal["auto", "targets", "inputs"] = "auto"
    """With loss = model, what ``labels=`` is: targets (the dataset's), inputs (the input ids, for models
    that shift labels themselves), or auto (inputs for a Hugging Face causal LM, else targets)."""
    weights: str | None = None
    """Pretrained weights to start from: a safetensors file or a folder of them (e.g. one written by
    Hugging Face's save_pretrained); every rank reads only the slices it holds."""
    tp_plan: str = "auto"
    """With parallel.tp > 1, how each layer is split: auto (the built-in GPT's plan, or a Hugging Face model's
    own base_model_tp_plan), or 'pkg.mod:fn' (fn(model) returns a dict of module paths to styles: a
    torch ParallelStyle, or 'colwise' / 'rowwise', as parallelize_module takes)."""

    def __post_init__(self) -> None:
        check(self.n_layers >= 1, f"model.n_layers must be >= 1, got {self.n_layers}")
        check(self.d_model >= 1, f"model.d_model must be >= 1, got {self.d_model}")
        check(
            self.n_heads >= 1 and self.d_model % self.n_heads == 0,
            f"model.n_heads ({self.n_heads}) must divide model.d_model ({self.d_model}); "
            f"try {', '.join(str(h) for h in divisors(self.d_model)[:6])}",
        )
        check(self.context >= 2, f"model.context must be >= 2, got {self.context}")
        check(0.0 <= self.dropout < 1.0, f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.module is not None:
            check(
                ":" in self.module,
                f"model.module must look like 'pkg.mod:function' or 'path/to/file.py:function', got {self.module!r}",
            )


@dataclasses.dataclass
class DataConfig:
    """Where the training samples come from."""

    path: str | None = None
    """A UTF-8 text file to train on (character-level), raw files (text, .jsonl, .parquet, .gz, folders of them)
    tokenized on the fly given data.tokenizer, or a folder of token shards made by `disttrain data prepare`
    (default: the bundled Shakespeare corpus)."""
    tokenizer: str | None = None
    """With a prepared folder: the tokenizer it must have been prepared with (a tokenizer.json, a save_pretrained
    folder, bytes, chars or bpe:VOCAB); with raw files: a tokenizer.json, a save_pretrained folder or bytes to tokenize
    them on the fly (chars: a text file read character by character). (default: the prepared folder's own)"""
    module: str | None = None
    """Your own dataset as 'pkg.mod:build' (or 'path/to/file.py:build'): returns a map-style dataset of (input,
    target) pairs, or a (train, val) pair of them."""
    val_fraction: float = 0.1
    """Share held out for evaluation: a text file's tail; raw files' documents, as prepare picks them (the first
    block's held-out windows are the evaluation set); a prepared folder's split is made by prepare."""

    def __post_init__(self) -> None:
        check(
            0.0 < self.val_fraction < 0.5,
            f"data.val_fraction must be in (0, 0.5), got {self.val_fraction}",
        )
        check(
            self.path is None or self.module is None,
            "set data.path or data.module, not both",
        )
        if self.module is not None:
            check(
                ":" in self.module,
                f"data.module must look like 'pkg.mod:function' or 'path/to/file.py:function', got {self.module!r}",
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
    """Characters of sample text printed at the end (the built-in GPT or a Hugging Face model, decoded by the data's
    tokenizer; 0 = none)."""
    skip_nonfinite: bool = True
    """Skip the optimizer step when the loss or grad norm is NaN/Inf (and count it)."""
    deterministic: bool = False
    """torch.use_deterministic_algorithms(True): slower, for bitwise reproducibility checks."""
    gc_interval: int = 50
    """Python's garbage collector: frozen after set-up and run every N steps on every rank at once, instead of
    full collections (~90 ms each here) at random moments on one rank while the others wait (0 = Python's own)."""

    def __post_init__(self) -> None:
        check(self.steps >= 1, f"train.steps must be >= 1, got {self.steps}")
        check(self.micro_batch >= 1, f"train.micro_batch must be >= 1, got {self.micro_batch}")
        check(
            self.global_batch >= self.micro_batch,
            f"train.global_batch ({self.global_batch}) must be >= train.micro_batch ({self.micro_batch})",
        )
        check(self.eval_interval >= 0, f"train.eval_interval must be >= 0, got {self.eval_interval}")
        check(self.eval_batches >= 1, f"train.eval_batches must be >= 1, got {self.eval_batches}")
        check(self.generate_chars >= 0, f"train.generate_chars must be >= 0, got {self.generate_chars}")
        check(
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
    """AdamW's decay rate of the gradient's running mean."""
    beta2: float = 0.95
    """AdamW's decay rate of the squared gradient's running mean."""
    eps: float = 1e-8
    """AdamW's term added to the denominator for numerical stability."""
    grad_clip: float = 1.0
    """Clip the global grad norm to this (0 = no clipping; the norm is still measured)."""

    def __post_init__(self) -> None:
        check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        check(0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        check(self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        check(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2 must be in [0, 1)")
        check(self.grad_clip >= 0, f"optim.grad_clip must be >= 0, got {self.grad_clip}")


@dataclasses.dataclass
class PrecisionConfig:
    """Mixed precision: low-precision compute, fp32 master weights and fp32 gradient reduction."""

    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Compute dtype for matmuls (params and optimizer state stay fp32); auto: bf16 where the hardware
    computes it fast (GPUs with bf16, CPUs with AMX or AVX512-BF16), else fp32."""
    reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """Gradient reduction dtype (FSDP)."""


def profile_window(text: str) -> tuple[int, int] | None:
    """'5:8' -> (5, 8), the steps ``metrics.profile`` records; None unless START:END with 1 <= START <= END."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if m is None or not 1 <= int(m.group(1)) <= int(m.group(2)):
        return None
    return int(m.group(1)), int(m.group(2))


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
    profile: str | None = None
    """Steps START:END (inclusive) to record with torch.profiler; a Chrome/Perfetto trace per rank in <run>/profile/."""

    def __post_init__(self) -> None:
        check(self.log_interval >= 1, f"metrics.log_interval must be >= 1, got {self.log_interval}")
        if self.profile is not None:
            check(
                profile_window(self.profile) is not None,
                f"metrics.profile must be START:END with 1 <= START <= END, got {self.profile!r}; "
                "e.g. --metrics.profile 5:8",
            )
        check(
            self.peak_tflops is None or self.peak_tflops > 0,
            f"metrics.peak_tflops must be > 0, got {self.peak_tflops}",
        )
