"""``parallel.compile``: torch.compile each block (the FSDP units) or the whole model, before FSDP/DDP wrap it.

What is compiled is a module's ``forward``, in place: parameter names do not change (checkpoints and
per-name initialisation are the same with and without it), identical blocks share one compiled graph (the
compile cost is one block's, as in torchtitan's per-block ``apply_compile``), and the hooks that
activation checkpointing and ``fully_shard`` add around a block stay outside the compiled code (eager),
so neither is traced. Only training forwards (gradients on) run compiled: evaluation and sampling run the
eager forward rather than compiling new graphs for no-grad and for every sampling length. ``model`` under
FSDP/HSDP gains nothing over ``blocks``: the root's trace stops at the first block's FSDP hook (a graph break
dynamo resolves by running the root eagerly) and only the blocks' forwards end up compiled; with activation
checkpointing it fails, so that pair is refused up front.

``auto`` picks what measured fastest on the device type (``benchmarks/bench_mfu.py --compile``, recorded in
docs/performance.md). A C++ compiler that is missing, or a compile that fails, becomes a
:class:`~disttrain.errors.ConfigError` naming the failure and the fix (``--parallel.compile off``).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from disttrain.errors import ConfigError

MODES = ("off", "blocks", "model")

AUTO: dict[str, str] = {
    # torchtitan's choice on GPUs: per-block graphs (fused elementwise work), FSDP-friendly, compiled once.
    "cuda": "blocks",
    # 2-core AMD EPYC (AVX2), torch 2.13, default GPT in fp32: compile buys little and costs ~1 min of g++
    # per process; see docs/performance.md.
    "cpu": "off",
}
"""What ``auto`` means per device type (anything not listed: off)."""

FIX = "run without it: --parallel.compile off (parallel.compile = 'off' in the job's TOML)"


def resolve_compile(mode: str, device_type: str) -> str:
    """``auto`` -> the mode that measured fastest on ``device_type``; other modes are kept."""
    if mode == "auto":
        return AUTO.get(device_type, "off")
    if mode not in MODES:
        raise ConfigError(f"parallel.compile must be auto, off, blocks or model, got {mode!r}")
    return mode


def check_compiler(device_type: str) -> None:
    """Inductor builds C++ kernels for CPU code: fail now, with the fix, if no C++ compiler works."""
    if device_type != "cpu":
        return
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        cpp_builder.get_cpp_compiler()
    except InvalidCxxCompiler as e:
        raise ConfigError(
            "parallel.compile needs a working C++ compiler on CPU (torch inductor builds C++ kernels) and found "
            f"none ({type(e).__name__}); install one (apt-get install g++) or point $CXX at it, or {FIX}"
        ) from e


def compile_error(err: Exception, what: str) -> ConfigError:
    """A dynamo/inductor failure as a one-line ConfigError with the fix (the cause stays chained)."""
    text = str(err).strip()
    first = text.splitlines()[0][:300] if text else ""
    return ConfigError(f"torch.compile of {what} failed ({type(err).__name__}: {first}); {FIX}")


def _guarded(eager: Callable[..., Any], compiled: Callable[..., Any], what: str) -> Callable[..., Any]:
    """The compiled function while gradients are on (training), the eager one otherwise; compile failures
    raise :func:`compile_error`."""
    from torch._dynamo.exc import TorchDynamoException

    @functools.wraps(eager)
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return eager(self, *args, **kwargs)
        try:
            return compiled(self, *args, **kwargs)
        except TorchDynamoException as e:
            raise compile_error(e, what) from e

    return forward


def compile_forward(module: nn.Module, what: str) -> None:
    """Replace ``module.forward`` (of this instance only) with its compiled form; names stay the same.

    The class's function is compiled (one cache for every instance of the class) and bound to the instance,
    so a ``copy.deepcopy`` of the module binds to the copy."""
    eager = type(module).forward
    module.forward = types.MethodType(_guarded(eager, torch.compile(eager), what), module)  # type: ignore[method-assign]


def apply_compile(
    model: nn.Module, blocks: list[nn.Module], mode: str, device_type: str, *, checkpointing: str = "none"
) -> str:
    """Compile each of ``blocks`` (``mode="blocks"``) or the whole ``model`` (``"model"``); ``"off"``: nothing.
    Returns the mode applied (``auto`` resolved).

    ``mode`` may be ``auto`` (resolved here for ``device_type``). Call after activation checkpointing
    (``checkpointing``: its spec, checked against the mode; its hooks stay outside the compiled forward either way
    round) and before FSDP/DDP wrap the model, as torchtitan does.
    """
    mode = resolve_compile(mode, device_type)
    if mode == "off":
        return mode
    if mode == "blocks" and not blocks:
        raise ConfigError(
            "parallel.compile = 'blocks' compiles each block, and parallel.shard_modules finds none in this "
            "model; set parallel.shard_modules to the blocks' class or ModuleList, or use parallel.compile = 'model'"
        )
    if mode == "model" and checkpointing != "none":
        raise ConfigError(
            f"parallel.compile = 'model' with parallel.activation_checkpointing = {checkpointing!r}: torch.compile "
            "of the whole model traces the checkpointed blocks' hooks and their recomputation fails; "
            "use parallel.compile = 'blocks' (each block compiled inside its checkpoint)"
        )
    check_compiler(device_type)
    if mode == "model":
        compile_forward(model, f"the model ({type(model).__name__})")
        return mode
    for i, block in enumerate(blocks):
        compile_forward(block, f"block {i} ({type(block).__name__})")
    return mode
