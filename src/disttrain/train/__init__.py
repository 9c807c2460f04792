"""Training: ``trainer`` (the Trainer: forward_backward_step, train_step, train), ``progress`` (console,
metrics sinks, throughput window, profiler), ``loss``, ``optim`` (optimizer, LR schedule, grad scaler),
``metrics`` (FLOPs, MFU, sinks, console), ``summary`` and ``profile``.

May import config, errors, utils, data, parallel, plan (``auto`` for the Python API only), checkpoint and health.
The job it runs is resolved above it (:class:`disttrain.config.ResolvedJob`); it never builds a plan of its own
for ``disttrain run``.
"""
