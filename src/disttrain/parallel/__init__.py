"""Distributed plumbing: ``env`` (process group, device, seeding), ``mesh`` (ParallelDims -> DeviceMesh),
``strategy`` (apply single | ddp | fsdp | hsdp), ``fsdp`` (fully_shard per unit, mixed precision, prefetch,
offload), ``meta_init`` (materialise a meta-device model), ``activation`` (activation checkpointing).

May import config, errors, utils and models; never reads files, never builds data, never imports train.
"""
