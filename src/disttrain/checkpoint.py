"""CheckpointManager: sharded (DCP) save/load, asynchronous, atomic commit, keep-k, resume, reshard.

On disk, under the checkpoint folder::

    step-00000100/            a complete checkpoint: DCP files + rng/ + manifest.json + COMMITTED (last)
    .tmp-step-00000200/       a save in progress (or one that crashed): never resumed from

A save writes into ``.tmp-step-N`` on every rank; once every rank's shard is written (DCP's final
collective), rank 0 writes ``manifest.json`` (sizes and CRC32 of every file), renames the folder to
``step-N`` and writes ``COMMITTED`` last, with fsyncs in between. A crash at any moment therefore leaves
the previous checkpoint as the newest complete one. Resume checks the marker, the manifest and every file
size, and reads ``.metadata`` with a restricted unpickler before DCP does (DCP itself uses plain pickle).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import signal
import threading
import time
import zlib
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from disttrain.config import DTYPES, CheckpointConfig

log = logging.getLogger("disttrain")
STEP_RE = re.compile(r"^step-(\d{8})$")
MARKER = "COMMITTED"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the folder and what is wrong with it."""


# -- what is saved ----------------------------------------------------------------------------------
class ModelOptimState(Stateful):
    """Model + optimizer as DCP state dicts (sharded under FSDP; FQNs without DDP's ``module.``)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return {"model": get_model_state_dict(self.model)}
        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optim": osd}

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


class _RestrictedUnpickler(pickle.Unpickler):
    """Only what DCP metadata legitimately holds: its own dataclasses, torch sizes/dtypes, builtins."""

    ALLOWED_PREFIXES = ("torch.distributed.checkpoint.",)
    ALLOWED = frozenset(
        {
            ("torch", "Size"),
            ("torch", "device"),
            ("torch.serialization", "_get_layout"),  # looks a layout up by name
            ("pathlib", "PosixPath"),
            ("pathlib", "WindowsPath"),
            ("collections", "OrderedDict"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "slice"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        attr = getattr(torch, name, None) if module == "torch" else None
        torch_constant = isinstance(attr, (torch.dtype, torch.layout, torch.memory_format))
        if module.startswith(self.ALLOWED_PREFIXES) or (module, name) in self.ALLOWED or torch_constant:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in checkpoint metadata")


def read_metadata_safely(ckpt: Path) -> Any:
    """DCP ``Metadata`` of a checkpoint folder, refusing pickles that would import arbitrary code."""
    path = ckpt / ".metadata"
    if not path.is_file():
        raise CheckpointError(f"{ckpt}: .metadata is missing")
    try:
        return _RestrictedUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as e:
        raise CheckpointError(f"{ckpt}: .metadata is unreadable or untrusted ({e})") from None


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader, but ``.metadata`` goes through the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        if kwargs.get("rank") is not None:  # DCP's fallback to per-rank metadata: not a format we write
            raise CheckpointError(f"{self.path}: no usable .metadata")
        md = read_metadata_safely(Path(self.path))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class WeightsOnlyBytes:
    """Planner mixin: non-tensor items (optimizer param groups, loop state) load with ``weights_only=True``
    (DCP's default planner uses ``weights_only=False``, which can run code from a tampered shard)."""

    flatten_state_dict: bool
    original_state_dict: Any
    mappings: Any
    state_dict: Any

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class SafeLoadPlanner(WeightsOnlyBytes, DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor items ``weights_only``."""


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
        self._purger: threading.Thread | None = None
        self.last_saved_step: int | None = None
        self.blocked_s: list[float] = []  # training-thread time spent per save (staging for async)
        self.failures: list[str] = []
        self._t_save = 0.0
        self._stager: Any = None
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
        self.wait()  # one save in flight at most
        self._t_save = time.time()
        tmp = self.folder / f".tmp-step-{step:08d}"
        if self.rank == 0:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        self._barrier()
        (tmp / "rng").mkdir(exist_ok=True)
        torch.save(rng_state(), tmp / "rng" / f"rank{self.rank}.pt")
        fault_point("before_shards", step, self.rank)
        if self.cfg.async_mode == "off":
            dcp.save(state, checkpoint_id=tmp, process_group=self._pg, no_dist=not dist.is_initialized())
            fault_point("after_shards", step, self.rank)
            self._commit(step, tmp)
        else:
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

            kind = AsyncCheckpointerType.PROCESS if self.cfg.async_mode == "process" else AsyncCheckpointerType.THREAD
            fut = dcp.async_save(
                state,
                checkpoint_id=tmp,
                process_group=self._pg,
                async_checkpointer_type=kind,
                async_stager=self._get_stager(),
                no_dist=not dist.is_initialized(),
            )
            upload: Future[Any] = fut.upload_completion if isinstance(fut, AsyncSaveResponse) else fut
            done = threading.Event()

            def on_done(f: Future[Any]) -> None:  # runs as soon as every rank's shard is written
                try:
                    self._finish(step, tmp, f)
                finally:
                    done.set()

            upload.add_done_callback(on_done)
            self._pending = (step, done)
        self.blocked_s.append(time.perf_counter() - t0)

    def _get_stager(self) -> Any:
        """One stager for the job: its CPU buffers are reused by every save (0.20 -> 0.12 of a sync save's time,
        benchmarks/bench_checkpoint.py). Safe because a save starts only after the previous one is written.
        Pinned memory where CUDA is, so the device-to-host copy does not block."""
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(cuda, self.cfg.async_mode == "process", False, cuda))
        return self._stager

    def wait(self) -> None:
        """Block until the in-flight save (if any) is written and committed."""
        if self._pending is not None:
            self._pending[1].wait()
            self._pending = None

    def _finish(self, step: int, tmp: Path, fut: Future[Any]) -> None:
        """Commit a finished background save; a failed one is reported, never committed, and training goes on."""
        try:
            fut.result()
            fault_point("after_shards", step, self.rank)
        except Exception as e:
            msg = f"checkpoint at step {step} failed and was not committed: {type(e).__name__}: {e}"
            self.failures.append(msg)
            log.error(msg)
            if self.rank == 0:
                print(f"disttrain: warning: {msg}", flush=True)
            return
        self._commit(step, tmp)

    def _commit(self, step: int, tmp: Path) -> None:
        if self.rank == 0:
            files = {
                str(p.relative_to(tmp)): {"size": p.stat().st_size, "crc32": crc32_file(p)}
                for p in sorted(tmp.rglob("*"))
                if p.is_file()
            }
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
        self._purger = threading.Thread(target=self.purge, name="disttrain-ckpt-purge", daemon=True)
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
        """Load ``state`` in place from ``info`` (resharding to this world size); returns its step."""
        self.wait()
        dcp.load(
            state,
            no_dist=not dist.is_initialized(),
            storage_reader=SafeFileSystemReader(info.path),
            planner=SafeLoadPlanner(),
            process_group=self._pg,
        )
        rng_file = info.path / "rng" / f"rank{self.rank}.pt"
        same_world = (info.manifest or {}).get("world_size") == self.world_size
        if same_world and rng_file.is_file():
            set_rng_state(torch.load(rng_file, weights_only=True))
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


def _stop_checkpoint_process() -> None:
    """Ask DCP's background save process to exit (it otherwise dies noisily when the trainer exits)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.__del__()
        ape._CHECKPOINT_PROCESS = None


def rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def fault_point(name: str, step: int, rank: int) -> None:
    """Fault injection for tests: DISTTRAIN_FAULT='<point>:<step>:<rank>' SIGKILLs this process there,
    on the first attempt only (a job restarted by torchrun then runs through)."""
    spec = os.environ.get("DISTTRAIN_FAULT", "")
    if spec == f"{name}:{step}:{rank}" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os.kill(os.getpid(), signal.SIGKILL)


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
