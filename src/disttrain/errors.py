"""Every exception type disttrain raises on purpose, in one place at the bottom of the import graph.

Each message says what was wrong, the value, and the fix; the CLI prints it as one line (exit 2 for a
mistake in the job, 3 for a job stopped on purpose) instead of a traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration mistake the user can fix; the message says what, the value, and how."""


class MetaDeviceError(ConfigError):
    """The model cannot be built on the meta device (sharded strategies and the memory plan need that)."""


class ModelBuildError(ConfigError):
    """The user's model function raised (anywhere, not only on the meta device)."""


class VocabularyError(ConfigError):
    """The model's input embedding has fewer rows than the data has token ids."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the folder and what is wrong with it."""


class HealthError(RuntimeError):
    """Training stopped on purpose (bad steps); the message says why and what to change."""


class Preempted(RuntimeError):
    """Training stopped after a step on SIGTERM / SIGUSR1 (preemption), with a checkpoint of that step."""

    def __init__(self, step: int, signum: int, saved: bool) -> None:
        self.step, self.signum, self.saved = step, signum, saved
        kept = f"checkpoint of step {step} saved" if saved else "no checkpoint manager: nothing saved"
        super().__init__(f"stopped after step {step} on signal {signum} (preemption); {kept}")


class RpcError(RuntimeError):
    """A remote call failed or timed out; the message names the worker, the call and the cause."""
