"""The plan per strategy (memory and step time) and ``auto``: profile a model on the meta device, estimate
bytes per rank and the step time, render the table, and measure the plan against real ranks.

- ``profile``: :func:`~disttrain.plan.profile.profile_model` (parameters per FSDP unit, saved activations per
  block, fused-attention accounting). Imports config, errors and dist.
- ``render``: the per-rank table and predicted vs measured (presentation only). Imports utils and profile
  (``estimate`` for type hints only).
- ``estimate``: the byte arithmetic per strategy, the step times and the recommendation, and
  :func:`~disttrain.plan.estimate.plan_job`. Imports config, errors, utils, build, dist, profile, comm, timing
  and render.
- ``choose``: :func:`~disttrain.plan.choose.decide` (what runs, why, the FSDP knobs resolved) and
  :func:`~disttrain.plan.choose.auto_strategy` (how the Trainer asks for ``auto``).
- ``comm``: every collective a strategy runs per step (sizes, rings, counts). ``machine``: this machine's link
  and matmul figures, measured by ``disttrain doctor`` and cached per host. ``timing``: the predicted step
  (compute, communication, overlap), the grouping of blocks into FSDP units and the prefetch depth.
  ``explain``: ``estimate --explain``'s text.

Pure arithmetic over a model: nothing here imports ``train``, ``launch``, ``jobs`` or ``cli``, and nothing
starts a process; the loss it profiles with is the caller's argument. Measuring the plan against real ranks
and ``disttrain estimate`` itself are jobs (:mod:`disttrain.jobs.measure`, :mod:`disttrain.jobs.estimate`).
"""
