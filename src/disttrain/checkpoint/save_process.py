"""DCP's background save process of this rank (``checkpoint.async_mode = "process"``): stop it when the job
closes or after a failed save (``stop_save_process``)."""

from __future__ import annotations

import contextlib


def stop_save_process() -> None:
    """Ask DCP's background save process to exit (it otherwise dies noisily when the trainer exits)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.__del__()
        ape._CHECKPOINT_PROCESS = None
