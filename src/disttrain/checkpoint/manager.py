"""CheckpointManager: sharded (DCP) save/load, asynchronous, atomic commit, keep-k, resume, reshard.

On disk, under the checkpoint folder::

    step-00000100/            a complete checkpoint: DCP files + rng/ + manifest.json + COMMITTED (last)
    .tmp-step-00000200/       a save in progress (or one that crashed): never resumed from

A save writes into ``.tmp-step-N`` on every rank; each rank checksums its own files as it writes them and
leaves the CRC32s in ``.checksums/rank<r>.json``. Once every rank's shard is written (DCP's final
collective), rank 0 merges those into ``manifest.json`` (sizes and CRC32 of every file), renames the folder
to ``step-N`` and writes ``COMMITTED`` last, with fsyncs in between. A crash at any moment therefore leaves
the previous checkpoint as the newest complete one. Resume checks the marker, the manifest and every file
size, and reads ``.metadata`` with a restricted unpickler before DCP does (DCP itself uses plain pickle).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import operator
import os
import re
import shutil
import signal
import threading
import time
import uuid
import warnings
import zlib
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import state_dict as _dsd
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from disttrain.checkpoint.reader import SafeFileSystemReader, SafeLoadPlanner, read_metadata_safely
from disttrain.checkpoint.writer import CHECKSUMS, ChecksummingWriter, _bytes_of, _lower_this_thread
from disttrain.config import DTYPES, CheckpointConfig
from disttrain.errors import CheckpointError
from disttrain.utils.faults import fault_error, fault_matches, fault_point
from disttrain.utils.gc import paused_gc

log = logging.getLogger("disttrain")
STEP_RE = re.compile(r"^step-(\d{8})$")
MARKER = "COMMITTED"
MANIFEST = "manifest.json"
_RNG_FILE = "rng/rank{}.pt"
FORMAT_VERSION = 1


# -- what is saved ----------------------------------------------------------------------------------
class ModelOptimState(Stateful):
    """Model + optimizer as DCP state dicts (sharded under FSDP; FQNs without DDP's ``module.``)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizer = optimizer
        self._info: tuple[tuple[torch.Tensor, ...], Any] | None = None  # (tensors it was made for, info)

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return {"model": get_model_state_dict(self.model)}
        # get_state_dict(model, optimizer), with its analysis of the model kept between saves
        info = self._state_dict_info(self.optimizer)
        msd = _dsd._get_model_state_dict(self.model, info)
        osd = _dsd._get_optim_state_dict(self.model, (self.optimizer,), info)
        _dsd._verify_state_dict(msd, osd, info)
        return {"model": msd, "optim": osd}

    def _state_dict_info(self, optimizer: torch.optim.Optimizer) -> Any:
        """What ``get_state_dict`` first works out from the model (every parameter's and buffer's FQN, shared
        parameters, FSDP modules: ~3 ms of the ~8 ms a call takes on the training thread for 250 tensors here),
        made again only when the model's or the optimizer's tensors are not the same objects as last time."""
        tensors = (
            *self.model.parameters(),
            *self.model.buffers(),
            *(p for group in optimizer.param_groups for p in group["params"]),
        )
        cached = self._info
        if cached is not None and len(tensors) == len(cached[0]) and all(map(operator.is_, tensors, cached[0])):
            return cached[1]
        info = _dsd._verify_options(self.model, (optimizer,), optim_only=False)
        self._info = (tensors, info)
        return info

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.optimizer is None or "optim" not in state_dict:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(self.model, state_dict["model"])
            return
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=StateDictOptions(strict=True),
        )


# -- files ------------------------------------------------------------------------------------------
def crc32_file(path: Path, chunk: int = 1 << 22) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _new_plan_key() -> str:
    """A fresh key for DCP's class-level save-plan cache (one per manager, renewed after a failed save)."""
    return f"disttrain-{uuid.uuid4().hex}"


def _collect_checksums(tmp: Path) -> dict[str, tuple[int, int]]:
    """Merge (and remove) the ranks' checksum sidecars of a save in progress: relative path -> (size, crc32)."""
    merged: dict[str, tuple[int, int]] = {}
    folder = tmp / CHECKSUMS
    if not folder.is_dir():
        return merged
    for f in sorted(folder.glob("rank*.json")):
        for name, meta in json.loads(f.read_text()).items():
            merged[name] = (int(meta["size"]), int(meta["crc32"]))
    shutil.rmtree(folder)
    return merged


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    complete: bool
    problem: str | None
    manifest: dict[str, Any] | None

    @property
    def usable(self) -> bool:
        return self.complete and self.problem is None


def inspect_folder(path: Path, checksums: bool = False) -> CheckpointInfo:
    """Is ``path`` a complete, intact checkpoint? (sizes always; CRC32s when ``checksums``)."""
    m = STEP_RE.match(path.name)
    step = int(m.group(1)) if m else -1
    if not (path / MARKER).is_file():
        return CheckpointInfo(path, step, False, "no COMMITTED marker (the save did not finish)", None)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return CheckpointInfo(path, step, True, f"manifest.json unreadable ({e})", None)
    for name, meta in manifest["files"].items():
        f = path / name
        if not f.is_file():
            return CheckpointInfo(path, step, True, f"{name} is missing", manifest)
        size = f.stat().st_size
        if size != meta["size"]:
            return CheckpointInfo(path, step, True, f"{name} has {size} bytes, expected {meta['size']}", manifest)
        if checksums and crc32_file(f) != meta["crc32"]:
            return CheckpointInfo(path, step, True, f"{name} fails its CRC32 check (corrupted)", manifest)
    try:
        read_metadata_safely(path)
    except CheckpointError as e:
        return CheckpointInfo(path, step, True, str(e).split(": ", 1)[-1], manifest)
    return CheckpointInfo(path, step, True, None, manifest)


def list_checkpoints(folder: Path, checksums: bool = False) -> list[CheckpointInfo]:
    """Every ``step-N`` and ``.tmp-step-N`` folder, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        if p.is_dir() and (STEP_RE.match(p.name) or p.name.startswith(".tmp-step-")):
            info = inspect_folder(p, checksums)
            if p.name.startswith(".tmp-step-"):
                step = int(p.name.rsplit("-", 1)[-1])
                info = CheckpointInfo(p, step, False, "unfinished save (temporary folder)", None)
            found.append(info)
    return sorted(found, key=lambda i: (i.step, i.path.name))


# -- the manager ------------------------------------------------------------------------------------
_IMMUTABLE = frozenset({int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size})


class _BatchedCopyStager(StateDictStager):
    """DCP's state-dict stager (a deep copy whose tensors land in cached CPU storages, reused every save),
    except that the copies of CPU storages are gathered during the walk and done in one
    ``torch._foreach_copy_``, which releases the GIL for the whole copy. DCP's per-storage ``copy_`` holds
    it: a background copy then stalled the training thread in 5 ms slices (the switch interval), up to
    ~45 ms per ``save()``, and slowed the next step. Other devices (pinned, non-blocking CUDA copies) go
    DCP's way."""

    def __init__(self, share_memory: bool) -> None:
        super().__init__(pin_memory=False, share_memory=share_memory)
        self._pairs: list[tuple[torch.UntypedStorage, torch.UntypedStorage]] = []

    def stage(self, state_dict: Any, non_blocking: bool = False) -> Any:
        self._pairs = []
        try:
            with torch.no_grad():
                staged = self._copy(state_dict, {}, non_blocking)
            if self._pairs:
                torch._foreach_copy_([_bytes_of(d) for d, _ in self._pairs], [_bytes_of(s) for _, s in self._pairs])
        finally:
            self._pairs = []
        return staged

    def _copy(self, x: Any, memo: dict[int, Any], non_blocking: bool) -> Any:
        """The deep copy, with the common cases done here in a few steps each: dicts, lists and tuples,
        immutable leaves, and plain CPU tensors (a view of the staged storage); anything else goes through
        DCP's generic copy (which enters a no_grad context and consults a dispatch table per object: 18 ms
        for the 850 tensors of a 216 MB state here vs ~5 ms this way), sharing the same memo."""
        cls = type(x)
        if cls is dict:
            return {k: self._copy(v, memo, non_blocking) for k, v in x.items()}
        if cls is list:
            return [self._copy(v, memo, non_blocking) for v in x]
        if cls is tuple:
            return tuple(self._copy(v, memo, non_blocking) for v in x)
        if cls in _IMMUTABLE:
            return x
        if cls is torch.Tensor and x.device.type == "cpu" and x.layout == torch.strided and not x.__dict__:
            storage = x.untyped_storage()
            staged = memo.get(id(storage))
            if staged is None:
                staged = memo[id(storage)] = self._stage_untyped_storage(storage, non_blocking)
            return torch.empty(0, dtype=x.dtype).set_(staged, x.storage_offset(), x.size(), x.stride())
        return self.deepcopy_with_tensor_offload(x, memo, non_blocking=non_blocking)

    def _stage_untyped_storage(self, storage: Any, non_blocking: bool = False) -> Any:
        if storage.device.type != "cpu":
            return super()._stage_untyped_storage(storage, non_blocking)
        cached = self._cached_storage_mapping.get(storage)
        if cached is None or cached.size() != storage.size():
            size = storage.size()
            cached = type(storage)._new_shared(size, device="cpu") if self.share_memory else type(storage)(size)
            self._cached_storage_mapping[storage] = cached
        self._pairs.append((cached, storage))
        return cached


class _DeferredStager(DefaultStager):
    """DCP's stager (copy into reused CPU buffers on its own thread), except that the copy starts when
    :meth:`start` is called rather than inside ``async_save``. Started at once, the copy thread (a Python walk
    over hundreds of tensors) competes for the GIL with the rest of ``async_save`` on the training thread:
    ``save()`` blocked the loop 15-30 ms here instead of ~10. ``stage`` hands DCP a future that the copy
    thread completes."""

    def __init__(self, config: StagingOptions, nice: int = 0) -> None:
        super().__init__(config)
        self.nice = nice
        if not config.use_pinned_memory:
            self._state_dict_stager = _BatchedCopyStager(config.use_shared_memory)
        self._deferred: tuple[Any, dict[str, Any], Future[Any]] | None = None

    def stage(self, state_dict: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._deferred = (state_dict, kwargs, fut)
        return fut

    def start(self) -> None:
        """Begin the copy staged last (a no-op when there is none)."""
        if self._deferred is None:
            return
        state_dict, kwargs, fut = self._deferred
        self._deferred = None

        def copy() -> None:
            _lower_this_thread(self.nice)
            try:
                fut.set_result(self._stage(state_dict, **kwargs))
            except BaseException as e:  # the save's upload thread reports it
                fut.set_exception(e)

        assert self._staging_executor is not None  # use_async_staging is on
        self._staging_executor.submit(copy)
        self._staging_future = fut


class CheckpointManager:
    """Owns the checkpoint lifecycle of one job: ``save`` / ``load`` / ``wait`` / ``close``."""

    def __init__(
        self,
        folder: str | Path,
        cfg: CheckpointConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        strategy: str = "single",
    ) -> None:
        self.folder = Path(folder)
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.strategy = strategy
        self._pending: tuple[int, threading.Event] | None = None
        self._staging: Future[Any] | None = None  # the in-flight async save's copy of the state
        self._purger: threading.Thread | None = None
        self.last_saved_step: int | None = None
        self.blocked_s: list[float] = []  # training-thread time spent in save() per save
        self.staging_wait_s: list[float] = []  # per async save: time wait_for_staging() blocked the loop
        self.failures: list[str] = []
        self._restart_process = False  # a process-mode save failed: the next one starts a new save process
        self._t_save = 0.0
        self._stager: _DeferredStager | None = None
        self._plan_key = _new_plan_key()
        self._pg = None
        if dist.is_initialized() and cfg.async_mode != "off":
            # async saves run collectives from a background thread: give them their own gloo group
            self._pg = dist.new_group(backend="gloo")
        if rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)

    # ---- save ----
    def save(self, step: int, state: dict[str, Any]) -> None:
        """Checkpoint ``state`` (Stateful objects and plain dicts) as step ``step``; async if configured."""
        t0 = time.perf_counter()
        with paused_gc():  # state dicts, plans, staging: thousands of small objects, no full collection here
            self._save(step, state)
        self.blocked_s.append(time.perf_counter() - t0)

    def _save(self, step: int, state: dict[str, Any]) -> None:
        self.wait()  # one save in flight at most
        self._t_save = time.time()
        tmp = self.folder / f".tmp-step-{step:08d}"  # the writers clear and create it: no barrier here
        rng = io.BytesIO()
        torch.save(rng_state(), rng)  # taken now; the writer writes it (in the background when async)
        writer = ChecksummingWriter(
            tmp,
            self.rank,
            step,
            {_RNG_FILE.format(self.rank): rng.getvalue()},
            direct_io=self.cfg.direct_io,
            nice=self.cfg.background_nice,
        )
        fault_point("before_shards", step, self.rank)
        if self.cfg.async_mode == "off":
            try:
                dcp.save(
                    state,
                    storage_writer=writer,
                    planner=self._save_planner(),
                    process_group=self._pg,
                    no_dist=not dist.is_initialized(),
                )
            except BaseException:
                self._plan_key = _new_plan_key()  # every rank saw the failure: every rank plans afresh
                raise
            fault_point("after_shards", step, self.rank)
            self._commit(step, tmp)
        else:
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

            kind = AsyncCheckpointerType.PROCESS if self.cfg.async_mode == "process" else AsyncCheckpointerType.THREAD
            if kind == AsyncCheckpointerType.PROCESS:
                self._prepare_save_process(step)
            stager = self._get_stager()
            try:
                fut = dcp.async_save(
                    state,
                    storage_writer=writer,
                    planner=self._save_planner(),
                    process_group=self._pg,
                    async_checkpointer_type=kind,
                    async_stager=stager,
                    no_dist=not dist.is_initialized(),
                )
            finally:
                stager.start()  # also when async_save failed: its upload thread must not wait forever
            upload: Any = fut
            if isinstance(fut, AsyncSaveResponse):  # the copy runs in the background: wait_for_staging()
                upload, self._staging = fut.upload_completion, fut.staging_completion
            done = threading.Event()

            def on_done(f: Future[Any]) -> None:  # runs as soon as every rank's shard is written
                try:
                    self._finish(step, tmp, f)
                finally:
                    done.set()

            upload.add_done_callback(on_done)
            self._pending = (step, done)

    def _prepare_save_process(self, step: int) -> None:
        """After a failed process-mode save, stop this rank's DCP save process (dead, or alive with a process
        group whose peer died) so that this save starts a new one. Every rank does so at the same save: a
        failed DCP save fails on every rank (its collectives carry any rank's error to all)."""
        if self._restart_process:
            self._restart_process = False
            log.warning("checkpoint: starting a new background save process after the failed save")
            _stop_checkpoint_process()
        if fault_matches("kill_save_process", step, self.rank):  # tests: the save process dies
            _kill_checkpoint_process()

    def _save_planner(self) -> DefaultSavePlanner:
        """DCP's planner with plan caching: after the first save, a rank whose plan did not change sends an
        empty one and the coordinator reuses the cached global plan and metadata (a 216 MB save on 2 ranks:
        median 290 -> 190 ms here, mostly less waiting in the planning collectives). Structure changes (the
        optimizer's state appearing after step 0) are detected by DCP, which plans those ranks again. The
        cache is keyed per manager, and dropped after a failed save."""
        planner = DefaultSavePlanner(enable_plan_caching=True)
        planner._cached_plans_key = self._plan_key
        return planner

    def _get_stager(self) -> _DeferredStager:
        """One stager for the job: its CPU buffers are reused by every save (0.20 -> 0.12 of a sync save's time,
        benchmarks/bench_checkpoint.py). Safe because a save starts only after the previous one is written.
        The copy itself runs on the stager's own thread, started as ``save()`` returns (:class:`_DeferredStager`),
        and the loop waits for the copy only before it next changes the state (:meth:`wait_for_staging`).
        Pinned memory and a non-blocking copy where CUDA is."""
        if self._stager is None:
            cuda = torch.cuda.is_available()
            options = StagingOptions(cuda, self.cfg.async_mode == "process", True, cuda)
            self._stager = _DeferredStager(options, self.cfg.background_nice)
        return self._stager

    def wait_for_staging(self) -> None:
        """Block until the in-flight async save has copied the state it saves. Call it before anything changes
        that state in place (the optimizer step); the time it blocks is kept in ``staging_wait_s``."""
        if self._staging is None:
            return
        t0 = time.perf_counter()
        with contextlib.suppress(Exception, CheckpointException):  # a failed copy fails the save: see _finish
            self._staging.result()
        self._staging = None
        self.staging_wait_s.append(time.perf_counter() - t0)

    def wait(self) -> None:
        """Block until the in-flight save (if any) is written and committed."""
        self.wait_for_staging()
        if self._pending is not None:
            self._pending[1].wait()
            self._pending = None

    def _finish(self, step: int, tmp: Path, fut: Future[Any]) -> None:
        """Commit a finished background save; a failed one is reported, never committed, and training goes on."""
        try:
            fut.result()
            fault_point("after_shards", step, self.rank)
            self._commit(step, tmp)
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            self._plan_key = _new_plan_key()  # DCP raised on every rank: every rank plans afresh next time
            msg = f"checkpoint at step {step} failed and was not committed: {_describe_failure(e)}"
            if self.cfg.async_mode == "process":
                self._restart_process = True
                msg += " (the next save starts a new background save process)"
            self.failures.append(msg)
            log.error(msg)
            if self.rank == 0:
                print(f"disttrain: warning: {msg}", flush=True)

    def _commit(self, step: int, tmp: Path) -> None:
        if self.rank == 0:
            sums = _collect_checksums(tmp)
            files = {}
            for p in sorted(tmp.rglob("*")):
                if not p.is_file():
                    continue
                name, size = str(p.relative_to(tmp)), p.stat().st_size
                known = sums.get(name)
                if known is not None and known[0] != size:
                    raise CheckpointError(
                        f"{p}: {size} bytes on disk, but its writer wrote {known[0]}: the file changed or was "
                        "cut short after it was written; not committing this checkpoint (check the disk)"
                    )
                # the ranks checksummed their shards while writing; the rest (.metadata) is small
                files[name] = {"size": size, "crc32": known[1] if known is not None else crc32_file(p)}
            manifest = {
                "format": FORMAT_VERSION,
                "step": step,
                "world_size": self.world_size,
                "strategy": self.strategy,
                "torch": torch.__version__,
                "time": time.time(),
                "files": files,
            }
            _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
            final = self.folder / f"step-{step:08d}"
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.folder)
            fault_point("before_marker", step, self.rank)
            _write_synced(final / MARKER, b"ok\n")
            _fsync_dir(final)
            log.info(
                "checkpoint step %d committed: %s (%.2fs after the save began)", step, final, time.time() - self._t_save
            )
            self._purge_in_background()
        self.last_saved_step = step

    def _purge_in_background(self) -> None:
        if self._purger is not None:
            self._purger.join()

        def purge() -> None:
            _lower_this_thread(self.cfg.background_nice)
            self.purge()

        self._purger = threading.Thread(target=purge, name="disttrain-ckpt-purge", daemon=True)
        self._purger.start()

    def purge(self) -> list[Path]:
        """Delete complete checkpoints beyond the newest ``keep_latest``, and unfinished ones older than the
        newest complete one. Never deletes the newest complete checkpoint."""
        infos = list_checkpoints(self.folder)
        complete = [i for i in infos if i.usable]
        if not complete:
            return []
        keep = {i.path for i in complete[-self.cfg.keep_latest :]}
        newest = complete[-1].step
        doomed = [i.path for i in infos if i.path not in keep and (i.usable or i.step < newest)]
        for p in doomed:
            shutil.rmtree(p, ignore_errors=True)
        return doomed

    # ---- load ----
    def latest(self) -> CheckpointInfo | None:
        """The newest complete, intact checkpoint; broken ones are skipped with a warning naming them."""
        for info in reversed(list_checkpoints(self.folder)):
            if info.usable:
                return info
            if self.rank == 0 and info.complete:
                msg = f"skipping checkpoint {info.path}: {info.problem}"
                log.warning(msg)
                print(f"disttrain: warning: {msg}", flush=True)
        return None

    def resolve(self, spec: str) -> CheckpointInfo | None:
        """What ``checkpoint.resume`` points at: auto (newest usable), never, a step number, or a path."""
        if spec == "never":
            return None
        if spec == "auto":
            return self.latest()
        path = self.folder / f"step-{int(spec):08d}" if spec.isdigit() else Path(spec)
        info = inspect_folder(path)
        if not info.usable:
            raise CheckpointError(f"checkpoint.resume={spec!r}: {path} cannot be used: {info.problem}")
        return info

    def load(self, state: dict[str, Any], info: CheckpointInfo) -> int:
        """Load ``state`` in place from ``info`` (resharding to this world size); returns its step.

        Every rank plans and reads on its own (``no_dist``): DCP's default load planning involves no global
        coordination (its global step returns the local plans unchanged), so its two collectives only
        pickled ~80 KB plans to rank 0 and back (10-20 ms of a 100 ms warm load here). One small all-gather
        afterwards keeps a failure collective: every rank raises, naming the rank(s) that failed."""
        self.wait()
        error: str | None = None
        try:
            fault_error("read_error", info.step, self.rank)
            # paused GC: DCP's plans are thousands of small objects, no full collection in the middle
            with paused_gc(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)  # no_dist: meant
                dcp.load(
                    state,
                    no_dist=True,
                    storage_reader=SafeFileSystemReader(info.path, rank=self.rank),
                    planner=SafeLoadPlanner(),
                )
            rng_file = info.path / _RNG_FILE.format(self.rank)
            same_world = (info.manifest or {}).get("world_size") == self.world_size
            if same_world and rng_file.is_file():
                set_rng_state(torch.load(rng_file, weights_only=True))
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            error = "; ".join(f"{type(x).__name__}: {x}" for _, x in _failures(e))
        errors = [error]
        if dist.is_initialized():
            errors = [None] * dist.get_world_size(self._pg)
            dist.all_gather_object(errors, error, group=self._pg)
        failed = [f"rank {r}: {err}" for r, err in enumerate(errors) if err]
        if failed:
            raise CheckpointError(f"{info.path}: loading failed ({'; '.join(failed)})")
        return info.step

    # ---- shutdown ----
    def close(self) -> None:
        self.wait()
        if self._purger is not None:
            self._purger.join()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self.cfg.async_mode == "process":
            _stop_checkpoint_process()
        self._barrier()

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier(group=self._pg)


def _failures(e: BaseException) -> list[tuple[int | None, BaseException]]:
    """(rank, exception) per failed rank of DCP's CheckpointException (which wraps every rank's); else
    ``[(None, e)]``."""
    failures = getattr(e, "failures", None)
    if isinstance(e, CheckpointException) and isinstance(failures, dict) and failures:
        return [(r, w[0] if isinstance(w, tuple) else w) for r, w in sorted(failures.items())]
    return [(None, e)]


def _describe_failure(e: BaseException) -> str:
    """One line per failed rank for DCP's CheckpointException (whose text is every rank's traceback)."""
    return "; ".join(f"{'' if r is None else f'rank {r}: '}{type(x).__name__}: {x}" for r, x in _failures(e))


def _stop_checkpoint_process() -> None:
    """Ask DCP's background save process to exit (it otherwise dies noisily when the trainer exits)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.__del__()
        ape._CHECKPOINT_PROCESS = None


def _kill_checkpoint_process() -> None:
    """SIGKILL DCP's background save process of this rank, if there is one (fault injection)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        os.kill(proc._save_process.pid, signal.SIGKILL)
        proc._save_process.join()


def rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -- export -----------------------------------------------------------------------------------------


def write_weights(state: dict[str, torch.Tensor], path: Path, dtype: str = "fp32") -> Path:
    """One file of plain model weights: ``.safetensors`` by suffix, else ``torch.save`` (weights_only-loadable)."""
    cast = {k: v.detach().to("cpu", DTYPES[dtype]).contiguous() for k, v in state.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(cast, str(tmp))
    else:
        torch.save(cast, tmp)
    os.replace(tmp, path)
    return path


def export_live_model(model: nn.Module, path: Path, dtype: str = "fp32") -> Path | None:
    """Gather the full model to rank 0 and write it there (collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return write_weights(sd, path, dtype)  # type: ignore[arg-type]
