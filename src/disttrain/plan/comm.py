"""What each strategy sends per optimizer step: every collective a rank takes part in, with its buffer size,
its ring (how many ranks, within a node or across nodes) and how often it runs.

Pure arithmetic over a :class:`~disttrain.plan.profile.ModelProfile`, mirroring what torch runs:

- DDP: one all-reduce of the fp32 gradients per step (in ``parallel.ddp_bucket_mb`` buckets), on the last
  micro-step only (``no_sync`` before it);
- FSDP2: per micro-step, an all-gather of every unit in forward (the root included) and again in backward for
  the units resharded after forward; per step, a reduce-scatter of every unit's gradients in the reduce dtype
  (``set_requires_gradient_sync(False)`` skips it on earlier micro-steps);
- HSDP: FSDP's all-gathers and reduce-scatters within a node, then an all-reduce of the gradient shards across
  the replicas (nodes);
- every strategy: the step's loss all-reduce, and under FSDP the grad-norm's.

Units are groups of ``blocks_per_unit`` adjacent blocks (:func:`unit_numels`), as ``apply_fsdp`` shards them.
May import: ``disttrain.config``, ``disttrain.parallel.blocks``, ``disttrain.plan.profile``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from disttrain.config import DTYPES, JobConfig
from disttrain.parallel.blocks import split_root
from disttrain.parallel.strategies import COLUMNS
from disttrain.plan.profile import AFTER, BEFORE, ROOT, ModelProfile, ParamInfo

SCALAR_BYTES = 16  # the loss (and a stop flag) as float64


@dataclass(frozen=True)
class Collective:
    """One kind of collective call: ``count`` calls per optimizer step of an ``nbytes`` buffer (the full,
    unsharded size) over a ring of ``group`` ranks, within a node (``intra``) or across nodes (``inter``)."""

    kind: str  # all_gather | reduce_scatter | all_reduce
    nbytes: int
    group: int
    link: str
    count: int
    what: str

    @property
    def sent_per_call(self) -> float:
        """Bytes each rank sends in one call (ring): (g-1)/g of the buffer, twice that for an all-reduce."""
        if self.group <= 1:
            return 0.0
        share = (self.group - 1) / self.group * self.nbytes
        return 2 * share if self.kind == "all_reduce" else share

    @property
    def sent(self) -> float:
        return self.count * self.sent_per_call


def unit_numels(prof: ModelProfile, shard: int, blocks_per_unit: int, root_units: str = "one") -> tuple[int, list[int]]:
    """(root numel, numel of every unit in forward order), each padded as FSDP2 pads dim 0 for ``shard`` ranks,
    as ``apply_fsdp`` makes them: ``blocks_per_unit`` adjacent blocks each, and with ``root_units`` split (see
    :func:`outer_split`) a unit for the embeddings before them and one for the head after."""
    root, before, after, per_block = _block_numels(prof.params, prof.n_blocks, shard)
    units = _group(per_block, blocks_per_unit)
    if outer_split(prof, shard, blocks_per_unit, root_units)[2]:
        return root, [n for n in (before, *units, after) if n]
    return root + before + after, units


def outer_split(prof: ModelProfile, shard: int, blocks_per_unit: int, root_units: str) -> tuple[int, int, bool]:
    """(numel outside the blocks that may be units of their own, the part after the blocks, whether
    :func:`~disttrain.parallel.blocks.split_root` makes them units for ``root_units``)."""
    _, before, after, per_block = _block_numels(prof.params, prof.n_blocks, shard)
    biggest = max(_group(per_block, blocks_per_unit), default=0)
    return before + after, after, split_root(root_units, before + after, biggest)


def _group(per_block: list[int], blocks_per_unit: int) -> list[int]:
    k = max(1, blocks_per_unit)
    return [sum(per_block[i : i + k]) for i in range(0, len(per_block), k)]


@functools.lru_cache(maxsize=64)
def _block_numels(params: tuple[ParamInfo, ...], n_blocks: int, shard: int) -> tuple[int, int, int, list[int]]:
    """(root, before, after, each block) numels, padded for ``shard`` ranks; cached (the plan asks for every
    grouping)."""
    per_block = [0] * n_blocks
    outer = {ROOT: 0, BEFORE: 0, AFTER: 0}
    for p in params:
        n = p.shard_numel(shard) * shard
        if p.unit >= 0:
            per_block[p.unit] += n
        else:
            outer[p.unit] += n
    return outer[ROOT], outer[BEFORE], outer[AFTER], per_block


def accum_steps(cfg: JobConfig, dp: int) -> int:
    """Micro-steps per optimizer step (as ``resolve_batch`` computes it; 1 when the batch does not divide)."""
    per_rank = cfg.train.global_batch // max(dp, 1)
    return max(1, per_rank // max(cfg.train.micro_batch, 1))


def _resharded_in_backward(policy: str, n_units: int) -> tuple[int, bool]:
    """(units all-gathered again in backward, whether the root is)."""
    if policy == "never":
        return 0, False
    if policy == "always":
        return n_units, True
    return max(n_units - 1, 0), False  # 'default': the last unit and the root stay gathered


def ddp_collectives(prof: ModelProfile, cfg: JobConfig, world: int, link: str) -> list[Collective]:
    grad_bytes = 4 * sum(p.numel for p in prof.params if p.trainable)
    bucket = int(cfg.parallel.ddp_bucket_mb * 2**20)
    calls = max(1, math.ceil(grad_bytes / bucket))
    return [
        Collective("all_reduce", grad_bytes // calls, world, link, calls, "gradient all-reduce (DDP buckets)"),
        Collective("all_reduce", SCALAR_BYTES, world, link, 1, "loss all-reduce"),
    ]


def fsdp_collectives(
    prof: ModelProfile, cfg: JobConfig, *, shard: int, replicate: int, blocks_per_unit: int, reshard: str, inter: bool
) -> list[Collective]:
    """FSDP (``replicate`` = 1) or HSDP: the shard ring is within a node unless ``inter`` (flat FSDP over nodes)."""
    cb = DTYPES[cfg.precision.dtype].itemsize
    rb = DTYPES[cfg.precision.reduce_dtype].itemsize
    accum = accum_steps(cfg, shard * replicate)
    root, units = unit_numels(prof, shard, blocks_per_unit, cfg.parallel.root_units)
    link = "inter" if inter else "intra"
    again, root_again = _resharded_in_backward(reshard, len(units))
    out: list[Collective] = []
    for i, n in enumerate(units):
        gathers = accum * (1 + (1 if i < again else 0))
        out.append(Collective("all_gather", n * cb, shard, link, gathers, "unit all-gather"))
        out.append(Collective("reduce_scatter", n * rb, shard, link, 1, "unit reduce-scatter"))
    if root:
        out.append(
            Collective("all_gather", root * cb, shard, link, accum * (2 if root_again else 1), "root all-gather")
        )
        out.append(Collective("reduce_scatter", root * rb, shard, link, 1, "root reduce-scatter"))
    if replicate > 1:
        shard_bytes = (root + sum(units)) // shard * rb
        out.append(Collective("all_reduce", shard_bytes, replicate, "inter", 1, "gradient all-reduce across replicas"))
    world_link = "inter" if inter or replicate > 1 else "intra"
    out.append(Collective("all_reduce", SCALAR_BYTES, shard * replicate, world_link, 2, "loss and grad-norm"))
    return out


def collectives(
    strategy: str, prof: ModelProfile, cfg: JobConfig, nproc: int, nnodes: int, blocks_per_unit: int
) -> list[Collective]:
    """Every collective of one optimizer step for a plan column (``ddp``, ``fsdp``, ``fsdp_no_reshard``,
    ``hsdp``, ``fsdp_offload``)."""
    world = nproc * nnodes
    if world <= 1:
        return []
    link = "inter" if nnodes > 1 else "intra"
    column = COLUMNS[strategy]
    if not column.sharded:
        return ddp_collectives(prof, cfg, world, link)
    shard = column.shard_degree(nproc, nnodes)
    # HSDP shards within a node and replicates across nodes (one node: the same rings as FSDP)
    reshard = cfg.parallel.reshard_after_forward if column.reshard else "never"
    return fsdp_collectives(
        prof,
        cfg,
        shard=shard,
        replicate=world // shard,
        blocks_per_unit=blocks_per_unit,
        reshard=reshard,
        inter=shard == world and nnodes > 1,
    )
