"""CheckpointManager: sharded (DCP) save/load, asynchronous, atomic commit, keep-k, resume, reshard.

A save writes into the step's temporary folder (:mod:`~disttrain.checkpoint.layout`) on every rank; each rank
checksums its own files as it writes them and leaves the CRC32s in ``.checksums/rank<r>.json``. Once every
rank's shard is written (DCP's final collective), rank 0 merges those into ``manifest.json`` (sizes and CRC32 of
every file), renames the folder to ``step-N`` and writes ``COMMITTED`` last, with fsyncs in between. A crash at
any moment therefore leaves the previous checkpoint as the newest complete one. Resume checks the marker, the
manifest and every file size, and reads ``.metadata`` with a restricted unpickler before DCP does (DCP itself
uses plain pickle).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.staging import StagingOptions

from disttrain.checkpoint.direct_io import lower_this_thread
from disttrain.checkpoint.layout import (
    FORMAT_VERSION,
    MANIFEST,
    MARKER,
    RNG_FILE,
    TMP_PREFIX,
    CheckpointInfo,
    fsync_dir,
    list_checkpoints,
    manifest_files,
    resume_target,
    step_dir_name,
    tmp_dir_name,
    write_synced,
)
from disttrain.checkpoint.reader import SafeFileSystemReader, SafeLoadPlanner
from disttrain.checkpoint.save_process import stop_save_process
from disttrain.checkpoint.staging import DeferredStager
from disttrain.checkpoint.state import rng_state, set_rng_state
from disttrain.checkpoint.writer import ChecksummingWriter
from disttrain.config import CheckpointConfig
from disttrain.errors import CheckpointError
from disttrain.utils import hooks
from disttrain.utils.gc import paused_gc

log = logging.getLogger("disttrain")


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
        self._stager: DeferredStager | None = None
        self._plan_key = _new_plan_key()
        self._pg = None
        if dist.is_initialized() and cfg.async_mode != "off":
            # async saves run collectives from a background thread: give them their own gloo group
            self._pg = dist.new_group(backend="gloo")
        if rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            for left in self.folder.glob(f"{TMP_PREFIX}*"):  # a crashed attempt's: no save of this one runs yet
                shutil.rmtree(left, ignore_errors=True)

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
        tmp = self.folder / tmp_dir_name(step)  # the writers clear and create it: no barrier here
        writer = self._writer(tmp, step)
        hooks.fire("save_start", step, self.rank)
        if self.cfg.async_mode == "off":
            self._save_now(step, state, tmp, writer)
        else:
            self._save_in_background(step, state, tmp, writer)

    def _writer(self, tmp: Path, step: int) -> ChecksummingWriter:
        """This rank's writer of the save into ``tmp``, holding the RNG state as it is now."""
        rng = io.BytesIO()
        torch.save(rng_state(), rng)  # taken now; the writer writes it (in the background when async)
        return ChecksummingWriter(
            tmp,
            self.rank,
            step,
            {RNG_FILE.format(self.rank): rng.getvalue()},
            direct_io=self.cfg.direct_io,
            nice=self.cfg.background_nice,
        )

    def _save_now(self, step: int, state: dict[str, Any], tmp: Path, writer: ChecksummingWriter) -> None:
        """A synchronous save: written and committed when this returns."""
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
        hooks.fire("save_written", step, self.rank)
        self._commit(step, tmp)

    def _save_in_background(self, step: int, state: dict[str, Any], tmp: Path, writer: ChecksummingWriter) -> None:
        """An async save (thread or process): the state is copied and written in the background, and committed
        by :meth:`_finish` once every rank's shard is written."""
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
            stop_save_process()
        hooks.fire("process_save_start", step, self.rank)

    def _save_planner(self) -> DefaultSavePlanner:
        """DCP's planner with plan caching: after the first save, a rank whose plan did not change sends an
        empty one and the coordinator reuses the cached global plan and metadata (a 216 MB save on 2 ranks:
        median 290 -> 190 ms here, mostly less waiting in the planning collectives). Structure changes (the
        optimizer's state appearing after step 0) are detected by DCP, which plans those ranks again. The
        cache is keyed per manager, and dropped after a failed save."""
        planner = DefaultSavePlanner(enable_plan_caching=True)
        planner._cached_plans_key = self._plan_key
        return planner

    def _get_stager(self) -> DeferredStager:
        """One stager for the job: its CPU buffers are reused by every save (0.20 -> 0.12 of a sync save's time,
        benchmarks/bench_checkpoint.py). Safe because a save starts only after the previous one is written.
        The copy itself runs on the stager's own thread, started as ``save()`` returns (:class:`DeferredStager`),
        and the loop waits for the copy only before it next changes the state (:meth:`wait_for_staging`).
        Pinned memory and a non-blocking copy where CUDA is."""
        if self._stager is None:
            cuda = torch.cuda.is_available()
            options = StagingOptions(cuda, self.cfg.async_mode == "process", True, cuda)
            self._stager = DeferredStager(options, self.cfg.background_nice)
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
            hooks.fire("save_written", step, self.rank)
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
            files = manifest_files(tmp)
            manifest = {
                "format": FORMAT_VERSION,
                "step": step,
                "world_size": self.world_size,
                "strategy": self.strategy,
                "torch": torch.__version__,
                "time": time.time(),
                "files": files,
            }
            write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
            final = self.folder / step_dir_name(step)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_dir(self.folder)
            hooks.fire("save_commit", step, self.rank)
            write_synced(final / MARKER, b"ok\n")
            fsync_dir(final)
            log.info(
                "checkpoint step %d committed: %s (%.2fs after the save began)", step, final, time.time() - self._t_save
            )
            self._purge_in_background()
        self.last_saved_step = step

    def _purge_in_background(self) -> None:
        if self._purger is not None:
            self._purger.join()

        def purge() -> None:
            lower_this_thread(self.cfg.background_nice)
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
        return resume_target(self.folder, spec)

    def load(self, state: dict[str, Any], info: CheckpointInfo) -> int:
        """Load ``state`` in place from ``info`` (resharding to this world size); returns its step.

        Every rank plans and reads on its own (``no_dist``): DCP's default load planning involves no global
        coordination (its global step returns the local plans unchanged), so its two collectives only
        pickled ~80 KB plans to rank 0 and back (10-20 ms of a 100 ms warm load here). One small all-gather
        afterwards keeps a failure collective: every rank raises, naming the rank(s) that failed."""
        self.wait()
        error: str | None = None
        try:
            hooks.fire("load_start", info.step, self.rank)
            # paused GC: DCP's plans are thousands of small objects, no full collection in the middle
            with paused_gc(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)  # no_dist: meant
                dcp.load(
                    state,
                    no_dist=True,
                    storage_reader=SafeFileSystemReader(info.path, rank=self.rank),
                    planner=SafeLoadPlanner(),
                )
            rng_file = info.path / RNG_FILE.format(self.rank)
            same_world = (info.manifest or {}).get("world_size") == self.world_size
            if same_world and rng_file.is_file():
                set_rng_state(self._load_rng(rng_file, info))
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

    def _load_rng(self, rng_file: Path, info: CheckpointInfo) -> Any:
        """This rank's RNG state, read ``weights_only``: a file that is no plain tensor file (damaged or tampered)
        is refused in one line that names it and the checkpoints that can be used instead."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's note on the pickle protocol of the file it refuses
                return torch.load(rng_file, weights_only=True)
        except Exception as e:
            # torch's message advises weights_only=False (running the file's code): only the reason is kept
            found = re.search(r"WeightsUnpickler error:\s*(.+?)(\n\n|$)", str(e), re.S)
            lines = str(e).strip().splitlines()
            why = (found.group(1).strip() if found else lines[0] if lines else type(e).__name__)[:160]
            others = [c.step for c in list_checkpoints(self.folder) if c.usable and c.step != info.step]
            instead = (
                f"resume from step {others[-1]} instead (--checkpoint.resume {others[-1]})"
                if others
                else ("no other complete checkpoint is here")
            )
            raise CheckpointError(
                f"{rng_file.relative_to(info.path)} refused: not a plain tensor file, damaged or tampered "
                f"({type(e).__name__}: {why}); {instead}"
            ) from None

    # ---- shutdown ----
    def close(self) -> None:
        self.wait()
        if self._purger is not None:
            self._purger.join()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self.cfg.async_mode == "process":
            stop_save_process()
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


def _new_plan_key() -> str:
    """A fresh key for DCP's class-level save-plan cache (one per manager, renewed after a failed save)."""
    return f"disttrain-{uuid.uuid4().hex}"
