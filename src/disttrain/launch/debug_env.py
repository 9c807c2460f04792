"""Debug presets (``health.debug_presets``): the environment variables the launcher sets for its workers."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("disttrain")


DEBUG_PRESETS = ("comms", "anomaly")


def debug_env(presets: set[str], run_dir: Path) -> dict[str, str]:
    """Environment for ``--debug comms``: c10d consistency checks, gloo/NCCL logs, NCCL flight recorder."""
    if "comms" not in presets:
        return {}
    fr = run_dir / "health" / "flight_recorder"
    fr.mkdir(parents=True, exist_ok=True)
    return {
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",  # checks every collective's shapes/order across ranks
        "TORCH_CPP_LOG_LEVEL": "INFO",  # c10d + gloo logs
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,COLL",
        "NCCL_DEBUG_FILE": str(run_dir / "logs" / "nccl.%h.%p.log"),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # flight recorder: the last 2000 collectives per rank
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(fr / "nccl_trace_rank_"),
    }
