"""Distributed plumbing: ``env`` (process group, device, seeding), ``mesh`` (ParallelDims, the n-D layout ->
its DeviceMeshes), ``parallelize`` (the public API: a layout applied to a model, in one order), ``strategies/``
(the data-parallel strategy objects: single | ddp | fsdp | hsdp), ``tp`` (tensor parallelism), ``fsdp``
(fully_shard per unit, mixed precision, prefetch, offload), ``meta_init`` (materialise a meta-device model),
``activation`` (activation checkpointing).

May import config, errors, utils and models; never reads files, never builds data, never imports train.
"""
