"""Resolve once: the parent's decisions before any worker starts (device, processes, strategy, batch plan,
precision), checked against the memory plan. Made by the job, written to the run folder, read by everything
below; nothing below re-derives these facts.

- ``job``: :func:`plan_and_resolve` / :func:`resolve_job` (the decisions) and :class:`StrategyChoice`
- ``inputs``: the files a job names exist (data, checkpoints, weights) before the plan reads them
"""
