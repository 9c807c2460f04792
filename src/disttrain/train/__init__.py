"""The training loop: ``trainer`` (the Trainer), ``loss``, ``optim`` (optimizer, LR schedule, grad scaler),
``metrics`` (FLOPs, MFU, sinks, console).

May import config, errors, utils, data, dist, plan (``auto`` only), checkpoint and health.
"""
