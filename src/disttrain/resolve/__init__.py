"""Resolve once: the parent's decisions before any worker starts (device, processes, strategy, batch plan,
precision), checked against the memory plan. Made by the job, written to the run folder, read by everything
below; nothing below re-derives these facts.

- ``job``: :func:`resolve` (the decisions, into a :class:`~disttrain.config.ResolvedJob`)
- ``inputs``: the files a job names exist (data, checkpoints, weights) before the plan reads them
"""

from disttrain.resolve.job import resolve

__all__ = ["resolve"]
