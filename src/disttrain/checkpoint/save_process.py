"""DCP's background save process of this rank (``checkpoint.async_mode = "process"``): stop it when the job
closes or after a failed save (``stop_save_process``), kill it on purpose (``kill_save_process``, fault
injection)."""

from __future__ import annotations

import contextlib
import os
import signal


def stop_save_process() -> None:
    """Ask DCP's background save process to exit (it otherwise dies noisily when the trainer exits)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.__del__()
        ape._CHECKPOINT_PROCESS = None


def kill_save_process() -> None:
    """SIGKILL DCP's background save process of this rank, if there is one (fault injection)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        os.kill(proc._save_process.pid, signal.SIGKILL)
        proc._save_process.join()
