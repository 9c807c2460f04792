"""Measured memory per rank, to hold the plan (:mod:`disttrain.plan.estimate`) to account.

Exact accounting, not sampling, for what the plan predicts exactly: after an optimizer step (before
``zero_grad``) every rank sums the storage its tensors really hold — parameters, ``.grad``, AdamW state —
counting a DTensor by its local shard and a storage shared by several tensors once (FSDP2's padded
shards, DDP's bucket views), so padding shows. Activations are the bytes autograd saves in one forward
(saved-tensor hooks, each storage once, parameters excluded). The peak is the CUDA allocator's
``max_memory_allocated`` or, on CPU, the process RSS peak (sampled every millisecond) above the RSS
before the model was built.

``disttrain estimate --measure`` calls :func:`measure` (one launch per strategy, so that every RSS peak
starts from a fresh process); the workers run this module under torchrun, started through
:func:`disttrain.launch.torchrun.run_module_captured`.
May import: everything below ``disttrain.cli`` (it starts workers and runs the Trainer's steps).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from disttrain.config import JobConfig, from_dict, to_dict
from disttrain.launch.torchrun import run_module_captured, threads_per_rank
from disttrain.utils.malloc import allocator_is_ours, keep_large_buffers, trim_heap
from disttrain.utils.process import run_and_exit


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class Ledger:
    """Bytes by category; a storage seen before (in any category) is not counted again."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.storage: dict[str, int] = {}

    def add(self, category: str, tensors: Sequence[torch.Tensor]) -> None:
        self.storage.setdefault(category, 0)
        for t in tensors:
            st = _local(t).untyped_storage()
            if st.data_ptr() not in self.seen and st.nbytes() > 0:
                self.seen.add(st.data_ptr())
                self.storage[category] += st.nbytes()


def account(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Storage bytes this rank holds for parameters, gradients and optimizer state."""
    params = list(model.parameters())
    ledger = Ledger()
    ledger.add("params", params)
    ledger.add("grads", [p.grad for p in params if p.grad is not None])
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    ledger.add("optimizer", state)
    return ledger.storage


class SavedBytes:
    """Bytes autograd saves for backward while active, each storage once. Weights are left out: the
    parameters themselves, and tensors of a parameter's full shape (FSDP's gathered parameters, autocast's
    low-precision copies), which the plan counts as 'gathered / low-precision copies'."""

    def __init__(self, model: nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.exclude = {_local(p).untyped_storage()._cdata for p in model.parameters()}
        self.weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() >= 2}
        if isinstance(model, FSDPModule):  # DTensor shapes are the full (global) ones already
            self.weight_shapes |= {tuple(p.shape) for p in model.parameters()}
        self.seen: dict[int, int] = {}  # saved tensors stay alive through forward: their keys are unique
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        st = _local(t).untyped_storage()  # a DTensor (tensor parallelism) holds its local shard's bytes
        key = st._cdata  # the storage itself: alive while saved, so never confused with a newer one
        if key in self.exclude or (t.dim() >= 2 and tuple(t.shape) in self.weight_shapes):
            return t
        self.seen.setdefault(key, st.nbytes())
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())

    def __enter__(self) -> SavedBytes:
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


class RssPeak:
    """Peak resident set size of this process, sampled every millisecond in a thread."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _step(trainer: Any, keep_grads: bool, saved: SavedBytes | None = None) -> None:
    """``Trainer.train_step`` up to ``optimizer.step()``; without ``zero_grad`` when ``keep_grads``; the first
    micro-step's forward and loss inside ``saved`` (counting what autograd saves)."""

    def around_forward(i: int) -> Any:
        return saved if saved is not None and i == 0 else contextlib.nullcontext()

    trainer.forward_backward(trainer.loader.next_step(), around_forward=around_forward)
    trainer.model.clip_grad_norm_(trainer.cfg.optim.grad_clip)
    trainer.optimizer.step()
    if not keep_grads:
        trainer.optimizer.zero_grad(set_to_none=True)


def measure_strategy(
    cfg: JobConfig, strategy: str, env: Any, steps: int = 2, timed_steps: int = 3, keep_buffers: bool = False
) -> dict[str, Any]:
    """Run ``steps`` real steps of ``cfg`` with ``strategy`` on this rank, then ``timed_steps`` more (0: none, and
    no times); its measured bytes and step time (:func:`time_steps`). The bytes are measured with every large
    tensor mapped and unmapped (see :func:`measure`); ``keep_buffers``: the timed steps run with the allocator a
    CPU job runs with (:func:`disttrain.utils.malloc.keep_large_buffers`), after one more step to settle it. A
    sharded or tensor-parallel model is built on the meta device, as a job too large for one copy per rank is."""
    from disttrain.build import build_data, build_model, vocab_size
    from disttrain.parallel.strategies import COLUMNS
    from disttrain.train.trainer import Trainer

    # a plan column (a strategy with its options), or "single": DDP's column, run by one process or one TP group
    column = COLUMNS.get(strategy, COLUMNS["ddp"])
    name = strategy if strategy not in COLUMNS else column.strategy.name
    parallel = dataclasses.replace(cfg.parallel, strategy=name, offload=column.offload)  # type: ignore[arg-type]
    if not column.reshard:
        parallel = dataclasses.replace(parallel, reshard_after_forward="never")
    cfg = dataclasses.replace(cfg, parallel=parallel)
    train, _, text = build_data(cfg)
    vocab = vocab_size(train, text)
    gc.collect()
    trim_heap()
    cuda = env.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with RssPeak() as rss:
        base_rss = rss.peak
        model = build_model(cfg, vocab, on_meta=column.sharded or cfg.parallel.tp > 1)  # as a big job: no full copy
        trainer = Trainer(model, train, cfg, env=env)
        for _ in range(max(steps - 1, 0)):
            _step(trainer, keep_grads=False)
        saved = SavedBytes(trainer.model.module)
        _step(trainer, keep_grads=True, saved=saved)
        acc = account(trainer.model.module, trainer.optimizer)
    peak = torch.cuda.max_memory_allocated() - base if cuda else rss.peak - base_rss
    trainer.optimizer.zero_grad(set_to_none=True)
    if keep_buffers and keep_large_buffers():
        trainer.train_step()
    out = {
        "strategy": strategy,
        **acc,
        "activations_saved": saved.total,
        "peak": int(peak),
        "peak_source": "cuda max_memory_allocated" if cuda else "process RSS peak",
        **(time_steps(trainer, timed_steps) if timed_steps > 0 else {}),
    }
    del trainer, model
    gc.collect()
    return out


def time_steps(trainer: Any, n: int) -> dict[str, float]:
    """Median wall time of ``n`` whole ``train_step`` calls (ranks in step: a barrier before each), then one
    more under torch.profiler for its communication time (the rules of :mod:`disttrain.train.profile`)."""
    import time

    import torch.distributed as dist

    from disttrain.train.profile import step_times

    def barrier() -> None:
        if dist.is_initialized():
            dist.barrier()

    walls = []
    for _ in range(max(n, 1)):
        barrier()
        t0 = time.perf_counter()
        trainer.train_step()
        walls.append(time.perf_counter() - t0)
    barrier()
    with tempfile.TemporaryDirectory(prefix="disttrain-measure-trace-") as tmp:
        cpu = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=cpu) as prof, torch.profiler.record_function("step 0"):
            trainer.train_step()
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        profiled = step_times(json.loads((Path(tmp) / "trace.json").read_text()))
    comm = profiled[0].comm_ms / 1e3 if profiled else float("nan")
    return {"step_s": sorted(walls)[len(walls) // 2], "comm_s": comm}


def measure(
    cfg: JobConfig,
    nproc: int,
    strategies: list[str],
    steps: int = 2,
    timeout: float = 600,
    tuned: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One launch of ``nproc`` ranks per strategy (with its ``tuned`` parallel settings: the plan column's grouping
    and prefetch); per strategy, the largest rank's figures, or
    ``{"error": "exit N: <the launch's last lines>"}`` when it failed."""
    device = cfg.parallel.device if cfg.parallel.device != "auto" else "cpu"
    env = {
        "OMP_NUM_THREADS": str(threads_per_rank(nproc, device)),
        # glibc keeps freed blocks resident once its mmap threshold has grown: fix the threshold so that
        # large tensors are mmap'd and unmapped, and the RSS peak follows the live tensors (the timed steps
        # then switch to the allocator a job runs with: mapping every tensor made them 30-40% slower)
        "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536"),
    }
    keep = device == "cpu" and allocator_is_ours(os.environ)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="disttrain-measure-") as tmp:
        for s in strategies:
            spec = Path(tmp) / f"{s}.json"
            run_cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **(tuned or {}).get(s, {})))
            spec.write_text(
                json.dumps(
                    {"config": to_dict(run_cfg), "strategies": [s], "steps": steps, "out": tmp, "keep_buffers": keep}
                )
            )
            code, tail = run_module_captured(
                "disttrain.jobs.measure", [str(spec)], nproc, device, env=env, timeout=timeout
            )
            if code != 0:
                results[s] = {"error": f"exit {code}: {tail}"}
                continue
            ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text())[s] for r in range(nproc)]
            results[s] = max(ranks, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
    return results


def worker(spec_path: str) -> None:
    """One rank of a :func:`measure` launch: measure the spec's strategies (then its ``layouts``: ``{"name",
    "config", "strategy"}`` each, and optionally its own ``steps`` / ``timed_steps``: another config on the same
    ranks), write ``rank<R>.json``."""
    from disttrain.parallel.env import destroy_distributed, init_distributed

    spec = json.loads(Path(spec_path).read_text())
    cfg = from_dict(spec["config"])
    env = init_distributed(cfg.parallel.device, cfg.parallel.timeout_s)
    keep = bool(spec.get("keep_buffers", False))
    steps, timed = spec.get("steps", 2), spec.get("timed_steps", 3)
    out = {s: measure_strategy(cfg, s, env, steps, timed, keep) for s in spec["strategies"]}
    for extra in spec.get("layouts", []):  # other configs on the same ranks (a wider model, tensor parallelism)
        config, strategy = from_dict(extra["config"]), extra["strategy"]
        how = (extra.get("steps", steps), extra.get("timed_steps", timed))
        out[extra["name"]] = measure_strategy(config, strategy, env, *how, keep_buffers=keep)
    Path(spec["out"], f"rank{env.rank}.json").write_text(json.dumps(out))
    destroy_distributed()


if __name__ == "__main__":
    run_and_exit(lambda: worker(sys.argv[1]))  # skips interpreter teardown (gloo/DDP destructors can deadlock)
