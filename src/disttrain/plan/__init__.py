"""The memory plan per strategy and ``auto``: profile a model on the meta device, estimate bytes per rank,
render the table, and measure the plan against real ranks.

- ``profile``: :func:`~disttrain.plan.profile.profile_model` (parameters per FSDP unit, saved activations per
  block, fused-attention accounting). Imports config, errors and dist.
- ``render``: the per-rank table and predicted vs measured (presentation only). Imports utils and profile
  (``estimate`` for type hints only).
- ``estimate``: the byte arithmetic per strategy, the recommendation, :func:`~disttrain.plan.estimate.decide`
  and :func:`~disttrain.plan.estimate.auto_strategy` (how the Trainer asks for ``auto``), and
  :func:`~disttrain.plan.estimate.plan_job`. Imports config, errors, utils, build, dist, profile and render.

These three are pure arithmetic over a model: they never import ``train``, ``launch`` or ``cli``; the loss
they profile with is the caller's argument.

- ``measure``: starts workers (through ``disttrain.launch.torchrun``) and runs the Trainer's steps, so it sits
  above ``launch`` and ``train``.
- ``command``: ``disttrain estimate``'s work (plan, render, optionally measure); also above ``launch`` and
  ``train``, below ``cli``.
"""
