"""A model's profile for the memory plan, measured once on the meta device: the shape of every parameter and
which FSDP unit (block or root) owns it, and the activations autograd saves for one micro-batch, per block.

Nothing is allocated or computed: the forward runs through ``torch.func.functional_call`` with meta stand-ins
for every parameter and buffer, so a 70B-parameter config takes seconds. ``attention="flash"`` accounts
``F.scaled_dot_product_attention`` as CUDA's fused kernels run it (see :class:`FlashAttentionSaves`).

The loss is the caller's (``loss_fn``): the plan never imports the trainer.
May import: ``disttrain.config``, ``disttrain.errors``, ``disttrain.parallel`` (which blocks FSDP shards, which
blocks activation checkpointing recomputes).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from disttrain.config import DTYPES
from disttrain.errors import ConfigError
from disttrain.parallel.activation import checkpointed_indices
from disttrain.parallel.blocks import find_blocks, outer_units

LossFn = Callable[[Any, Any], torch.Tensor]
"""``loss_fn(model_output, targets) -> scalar loss``: what the profile runs after the forward."""


@dataclass(frozen=True)
class ParamInfo:
    shape: tuple[int, ...]
    unit: int
    """Index of the FSDP block that owns it; else ROOT (held by the root unit in any case), BEFORE (a module
    before the blocks: an embedding) or AFTER (final norm, head), which may be units of their own."""
    trainable: bool
    name: str = ""
    """The parameter's name in the model (its first name, where it is tied)."""
    tp_dim: int = -1
    """The dimension the tensor-parallel plan splits (-1: replicated over the TP group; see
    :mod:`disttrain.plan.tp`)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def shard_numel(self, n: int) -> int:
        """Elements one rank holds when sharded ``n`` ways: FSDP2 pads dim 0 to a multiple of n."""
        if n <= 1 or not self.shape:
            return self.numel
        return math.ceil(self.shape[0] / n) * (self.numel // self.shape[0])


@functools.lru_cache(maxsize=256)
def sharded_bytes(params: tuple[ParamInfo, ...], n: int, nbytes: int, trainable_only: bool = False) -> int:
    """Bytes one rank holds of ``params`` sharded ``n`` ways at ``nbytes`` per element (padding included)."""
    return sum(p.shard_numel(n) * nbytes for p in params if p.trainable or not trainable_only)


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
    """The largest storage autograd saves (for a language model, the loss's fp32 log-softmax over the vocabulary)."""
    micro_batch: int
    compute_dtype: str
    attention: str = "math"
    """How ``scaled_dot_product_attention`` was accounted: ``math`` (saves the T x T probabilities, as
    CPU and the meta device do) or ``flash`` (saves q, k, v, the output and the log-sum-exp: CUDA)."""
    train_flops: float = 0.0
    """FLOPs of one micro-batch's forward and backward (3x the forward's, counted by FlopCounterMode)."""
    forward_ops: int = 0
    """Operators one forward dispatches (each costs a few microseconds of framework time on a CPU, whatever
    its size: what dominates the step of a small model)."""
    forward_elements: int = 0
    """Floating-point elements one forward's element-wise and reduction operators write (:class:`OpCounter`):
    memory-bound work whose time the matmul FLOPs do not tell (it weighs more the narrower the model)."""

    @property
    def n_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def backward_transient(self) -> int:
        """Bytes that live beside the saved tensors at the peak, at the start of backward: the gradient flowing
        into the op that saved the largest tensor and the gradient it produces, each as large as that tensor
        (for a language model: the gradients of the log-softmax and of the logits, B x T x vocab in fp32; at the
        end of the forward the logits and their fp32 copy, about as large). Measured at a 16k vocabulary."""
        return 2 * self.largest_act

    def activations(self, ac: str = "none") -> int:
        """Peak activation bytes with activation checkpointing ``none``, ``full`` or every K-th block (the
        blocks :func:`disttrain.parallel.activation.checkpointed_indices` picks, as training does)."""
        total = self.act_other + sum(self.act_by_block) + self.backward_transient
        ckpt = checkpointed_indices(ac, self.n_blocks)
        if not ckpt:
            return total
        chosen = set(ckpt)
        saved = self.act_other + sum(a for i, a in enumerate(self.act_by_block) if i not in chosen)
        saved += sum(self.block_input_bytes[i] for i in ckpt)
        return saved + max(self.act_by_block[i] for i in ckpt) + self.backward_transient


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


ROOT, BEFORE, AFTER = -1, -2, -3  # ParamInfo.unit outside the blocks


def param_infos(model: nn.Module, blocks: list[nn.Module]) -> tuple[ParamInfo, ...]:
    """Every parameter of ``model`` with the index of the first block that holds it, or where it sits outside
    them (:func:`~disttrain.parallel.blocks.outer_units`)."""
    owner: dict[int, int] = {}
    for i, b in enumerate(blocks):
        for p in b.parameters():
            owner.setdefault(id(p), i)
    before, after = outer_units(model, blocks)
    for side, modules in ((BEFORE, before), (AFTER, after)):
        for m in modules:
            for p in m.parameters():
                owner.setdefault(id(p), side)
    return tuple(
        ParamInfo(tuple(p.shape), owner.get(id(p), ROOT), p.requires_grad, name) for name, p in model.named_parameters()
    )


def meta_stand_ins(model: nn.Module, compute_dtype: str) -> dict[str, torch.Tensor]:
    """Meta tensors for every parameter (floating ones in the compute dtype) and buffer, by name; a tied
    tensor under its first name only (functional_call ties the others to it)."""
    cdt = DTYPES[compute_dtype]
    stand_ins = {n: _meta_like(t, cdt) for n, t in model.named_parameters()}
    stand_ins.update({n: _meta_like(t, None) for n, t in model.named_buffers()})
    return stand_ins


class SavedTensorLog:
    """Bytes autograd saves during a forward, each storage once, by the block that was running (-1: outside
    every block), parameters left out; and each block's input size (what a checkpointed block keeps)."""

    def __init__(self, blocks: list[nn.Module], params: dict[str, torch.Tensor]) -> None:
        self.blocks = blocks
        self.param_storages = {t.untyped_storage()._cdata for t in params.values()}
        self.current = -1
        self.block_in = [0] * len(blocks)
        self.saved: dict[int, tuple[int, int]] = {}
        self.keep: list[torch.Tensor] = []

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in self.saved and key not in self.param_storages:
            self.saved[key] = (t.untyped_storage().nbytes(), self.current)
            self.keep.append(t)  # the storage must outlive the profile, so that its address is not reused
        return t

    def _enter(self, i: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            self.current = i
            if args and isinstance(args[0], torch.Tensor):
                self.block_in[i] = args[0].numel() * args[0].element_size()

        return hook

    def _leave(self, _m: nn.Module, _a: Any, _o: Any) -> None:
        self.current = -1

    @contextlib.contextmanager
    def watching(self) -> Iterator[SavedTensorLog]:
        """Block hooks and the saved-tensor hook installed while inside."""
        handles = [
            h
            for i, b in enumerate(self.blocks)
            for h in (b.register_forward_pre_hook(self._enter(i)), b.register_forward_hook(self._leave))
        ]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                yield self
        finally:
            for h in handles:
                h.remove()

    def by_block(self) -> tuple[list[int], int, int]:
        """(bytes saved per block, bytes saved outside the blocks, the largest saved storage)."""
        by_block = [0] * len(self.blocks)
        other = 0
        for nbytes, where in self.saved.values():
            if where >= 0:
                by_block[where] += nbytes
            else:
                other += nbytes
        return by_block, other, max((b for b, _ in self.saved.values()), default=0)


def _forward_on_meta(
    model: nn.Module, stand_ins: dict[str, torch.Tensor], batch: tuple[Any, Any], loss_fn: LossFn, attention: str
) -> tuple[float, int, int]:
    """The forward and the loss on meta tensors: the FLOPs of forward + backward (3x the forward's), the
    operators the forward dispatched and the elements its element-wise operators wrote;
    ConfigError (with the fix) for a model that cannot run so."""
    flash = FlashAttentionSaves() if attention == "flash" else None
    try:
        ops = OpCounter()
        with FlopCounterMode(display=False) as counter, ops, FusedAttention(ops), flash or contextlib.nullcontext():
            out = functional_call(model, stand_ins, (batch[0],))
            loss_fn(out, batch[1])
        return 3.0 * (counter.get_total_flops() + (flash.flops if flash is not None else 0)), ops.count, ops.elements
    except Exception as e:  # a model whose forward cannot run on meta tensors
        raise ConfigError(
            f"cannot profile the model on the meta device ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "the memory plan needs a forward that runs on meta tensors (no .item(), no data-dependent shapes); "
            "force a strategy with --parallel.strategy ddp|fsdp"
        ) from None


def profile_model(
    model: nn.Module,
    sample: tuple[Any, Any],
    *,
    micro_batch: int,
    loss_fn: LossFn,
    compute_dtype: str = "fp32",
    shard_modules: str = "auto",
    attention: str = "math",
) -> ModelProfile:
    """Profile ``model`` (on any device, or meta) for one micro-batch of ``sample`` = one dataset item, with
    the caller's ``loss_fn`` after the forward.

    The forward runs through ``torch.func.functional_call`` with meta stand-ins for every parameter and
    buffer: nothing is allocated or computed, and the model itself is not touched. ``attention="flash"``
    accounts ``F.scaled_dot_product_attention`` as CUDA's flash / memory-efficient kernels run it (O(T)
    saved per head) instead of the math path the meta device takes (the T x T probabilities).
    """
    blocks = find_blocks(model, shard_modules)
    params = param_infos(model, blocks)
    stand_ins = meta_stand_ins(model, compute_dtype)
    log = SavedTensorLog(blocks, stand_ins)
    batch = (_batch(sample[0], micro_batch), _batch(sample[1], micro_batch))
    with log.watching():
        flops, ops, elements = _forward_on_meta(model, stand_ins, batch, loss_fn, attention)
    by_block, other, largest = log.by_block()
    return ModelProfile(
        params,
        len(blocks),
        tuple(by_block),
        other,
        tuple(log.block_in),
        largest,
        micro_batch,
        compute_dtype,
        attention,
        flops,
        ops,
        elements,
    )


class OpCounter(TorchDispatchMode):
    """Counts the operators dispatched while active (views and metadata ops included: they cost dispatch too),
    and the floating-point elements written by those that are neither matmuls (FlopCounterMode's) nor views:
    the element-wise and reduction work (norms, activations, softmax, casts, adds) whose time scales with the
    elements, not the FLOPs."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.elements = 0
        self.fused = 0
        """Depth of fused calls (attention) being run: the meta device decomposes them, the devices do not."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        out = func(*args, **(kwargs or {}))
        if not self.fused and not func.is_view and func.overloadpacket not in flop_registry:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    self.elements += t.numel()
        return out


class FusedAttention(torch.overrides.TorchFunctionMode):
    """Marks ``F.scaled_dot_product_attention`` as one fused kernel for an :class:`OpCounter`: the meta device
    runs its math path (scores, mask, softmax, dropout over T x T per head), CPU and CUDA a fused kernel that
    writes only its output, whose time its FLOPs tell."""

    def __init__(self, ops: OpCounter) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        self.ops.fused += 1
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            self.ops.fused -= 1
        self.ops.elements += out.numel()
        return out


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


class FlashAttentionSaves(torch.overrides.TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to a stand-in that saves what CUDA's fused kernels save (q, k,
    v, the output and the log-sum-exp) while profiling for CUDA. A mask given as a tensor is an input the
    graph already holds, so it adds nothing here either. ``flops`` counts the two attention matmuls the
    stand-in skips (as FlopCounterMode would count the math path)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k, v = (args[i] if i < len(args) else kwargs[n] for i, n in enumerate(("query", "key", "value")))
            self.flops += 2 * q.numel() * k.shape[-2] + 2 * q.shape[:-1].numel() * k.shape[-2] * v.shape[-1]
            return _FlashSaves.apply(q, k, v)
        return func(*args, **kwargs)
