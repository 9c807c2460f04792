"""The bad-step guard: non-finite loss or gradient norm, and loss spikes against a running median."""

from __future__ import annotations

import collections
import logging
import math
import statistics
from typing import Any

from disttrain.config import HealthConfig

log = logging.getLogger("disttrain")


# bad steps -----------------------------------------------------------------------------------------------
class StepGuard:
    """Decides whether a step's loss / grad norm is bad (non-finite, or a spike over a rolling median) and
    counts consecutive bad steps. Fed with global (all-reduced) figures, so every rank decides alike."""

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        self.window: collections.deque[float] = collections.deque(maxlen=cfg.spike_window)
        self.consecutive = 0
        self.bad_steps = 0
        self.rollbacks = 0

    def check(self, loss: float, grad_norm: float) -> str | None:
        """None for a good step, else 'nonfinite' or 'spike'."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return "nonfinite"
        rtol = self.cfg.spike_rtol
        if rtol > 0 and len(self.window) >= min(10, self.window.maxlen or 10):
            ref = statistics.median(self.window)
            if loss > ref * (1 + rtol) and loss - ref > 1e-6:
                return "spike"
        return None

    def record(self, bad: str | None, loss: float) -> None:
        if bad is None:
            self.consecutive = 0
            self.window.append(loss)
        else:
            self.consecutive += 1
            self.bad_steps += 1

    @property
    def exhausted(self) -> bool:
        return self.consecutive >= self.cfg.max_bad_steps

    def state_dict(self) -> dict[str, Any]:
        """What a resumed job needs to judge the next steps as an uninterrupted one would: the loss window and
        the bad steps in a row (the counters of rollbacks and bad steps belong to the process, which logs them)."""
        return {"window": list(self.window), "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window.clear()
        self.window.extend(float(x) for x in state.get("window", []))
        self.consecutive = int(state.get("consecutive", 0))

    def reset(self) -> None:
        self.consecutive = 0
        self.window.clear()
