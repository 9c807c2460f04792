"""``disttrain estimate --explain``: why the plan chose what it chose, as text. Every grouping of blocks into
FSDP units that was tried (unit size, how much of the link's bandwidth its all-gather reaches, calls, predicted
step, memory), the prefetch depth and why, and the collectives of the recommended strategy one by one.

Presentation only, over an :class:`~disttrain.plan.estimate.Estimate` (types only from there).
May import: ``disttrain.config``, ``disttrain.utils``, ``disttrain.plan`` (comm, render, timing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disttrain.config import DTYPES, JobConfig
from disttrain.parallel.strategies import COLUMNS, LABELS, label
from disttrain.plan.comm import collectives, outer_split, unit_numels
from disttrain.plan.render import seconds
from disttrain.plan.timing import NEAR_BEST
from disttrain.plan.tp import tp_collectives
from disttrain.utils.fmt import fmt_bytes

if TYPE_CHECKING:
    from disttrain.plan.estimate import Estimate


def explain_plan(est: Estimate, cfg: JobConfig) -> str:
    """The groupings, the prefetch depth and the recommended strategy's collectives."""
    chosen = COLUMNS.get(est.choice)
    base = chosen.strategy.name if chosen is not None and chosen.sharded else "fsdp"  # its plain column
    parts = [_groupings(est, cfg, base), _prefetch(est)]
    parts.append(_collectives(est, cfg))
    parts.append(_tp_layouts(est))
    return "\n\n".join(p for p in parts if p)


def _tp_layouts(est: Estimate) -> str:
    """The candidate layouts with tensor parallelism the plan weighed, the one it runs marked."""
    if not est.tp_options:
        return ""
    lines = [
        "candidate layouts (tensor parallelism within a node; the strategy each would run over its TP groups):",
        f"  {'layout':<28} {'per rank':>10} {'fits':>4} {'step':>8} {'sent across nodes':>17}",
    ]
    for o in est.tp_options:
        mark = "*" if o.tp == est.layout.tp else " "
        lines.append(
            f"{mark} {o.label:<28} {fmt_bytes(o.total):>10} {'yes' if o.fits else 'NO':>4} "
            f"{seconds(o.predicted_s):>8} {fmt_bytes(int(o.sent_inter)):>17}"
        )
    lines.append(
        "* the plan above. `auto` moves to a TP layout when nothing fits without one, or when the traffic across "
        "nodes outruns the compute and a TP layout is predicted faster; a forced strategy's reason names it"
    )
    return "\n".join(lines)


def _groupings(est: Estimate, cfg: JobConfig, col: str) -> str:
    tried = est.groupings.get(col, {})
    if not tried or est.machine is None or est.layout.dp_world <= 1:
        return ""
    lay, prof = est.layout, est.rank_profile
    shard = COLUMNS[col].shard_degree(lay.dp_nproc, lay.nnodes)
    link = est.machine.link("inter" if shard == lay.dp_world and lay.nnodes > 1 else "intra")
    cb = DTYPES[cfg.precision.dtype].itemsize
    lines = [
        f"{LABELS[col]}: {prof.n_blocks} blocks grouped into units (one all-gather and one reduce-scatter per "
        f"unit; {'fixed by parallel.blocks_per_unit' if len(tried) == 1 else 'auto'})",
        f"{'blocks/unit':>11} {'units':>5} {'all-gather':>10} {'link use':>8} {'calls':>5} {'step':>8} "
        f"{'per rank':>10} {'fits':>4}",
    ]
    for k, t in sorted(tried.items()):
        _, units = unit_numels(prof, shard, k, cfg.parallel.root_units)
        size = max(units, default=0) * cb
        use = link.efficiency(size, shard) if shard > 1 else 1.0
        total = est.grouping_bytes[col][k]
        lines.append(
            f"{k:>11} {len(units):>5} {fmt_bytes(size):>10} {use:>8.0%} {t.calls:>5} {seconds(t.predicted_s):>8} "
            f"{fmt_bytes(total):>10} {'yes' if total <= lay.budget else 'NO':>4}"
        )
    chosen = est.times[col].blocks_per_unit
    if len(tried) == 1:
        why = "set by parallel.blocks_per_unit"
    elif any(total <= lay.budget for total in est.grouping_bytes[col].values()):
        why = (
            f"the fewest within {NEAR_BEST:.0%} of the fastest grouping that fits (fewer blocks per unit gather "
            "less memory at once and leave more to overlap)"
        )
    else:
        why = "no grouping fits, so the one that gathers the least at once (see `to fit` below)"
    lines.append(f"chosen: {chosen} block(s) per unit — {why}")
    lines.append(_root_units(est, cfg, shard, chosen))
    return "\n".join(lines)


def _root_units(est: Estimate, cfg: JobConfig, shard: int, blocks_per_unit: int) -> str:
    """Where the parameters outside the blocks (embeddings, final norm, head) go, and why."""
    setting = cfg.parallel.root_units
    outside, _, split = outer_split(est.rank_profile, shard, blocks_per_unit, setting)
    if not outside:
        root = unit_numels(est.rank_profile, shard, blocks_per_unit)[0]
        return f"embeddings and head: in the root unit ({fmt_bytes(4 * root)} fp32; none can be a unit of its own)"
    why = (
        f"parallel.root_units = {setting}"
        if setting != "auto"
        else (
            "auto: they hold at least as much as the biggest block unit"
            if split
            else "auto: they hold less than the biggest block unit, so two more units would save little memory"
        )
    )
    where = "in units of their own, before and after the blocks" if split else "in the root unit"
    return f"embeddings and head ({fmt_bytes(4 * outside)} fp32): {where} ({why})"


def _prefetch(est: Estimate) -> str:
    t = est.times.get("fsdp")
    if t is None or est.machine is None or est.layout.dp_world <= 1:
        return ""
    if not est.machine.overlap:
        return (
            "prefetch: depth 1 — gloo runs collectives on the cores that compute, so there is no compute to hide "
            "them behind; an explicit one-ahead prefetch still saves FSDP's implicit ordering (measured faster)"
        )
    return (
        f"prefetch: depth {t.prefetch} — the all-gather of a unit takes about {t.prefetch} unit forwards, so "
        f"gathering {t.prefetch} unit(s) ahead hides it behind compute"
    )


def _collectives(est: Estimate, cfg: JobConfig) -> str:
    col = est.choice if est.choice in est.times else "ddp"
    if est.machine is None or est.layout.world <= 1:
        return ""
    t = est.times[col]
    lay, prof = est.layout, est.rank_profile
    colls = collectives(col, prof, cfg, lay.dp_nproc, lay.nnodes, max(t.blocks_per_unit, 1))
    colls += tp_collectives(prof, cfg, lay.tp, lay.dp_world)
    lines = [f"collectives of {label(col, lay.tp)} per optimizer step (each rank):"]
    lines.append(f"{'what':<36} {'kind':<14} {'buffer':>10} {'ranks':>5} {'link':>5} {'calls':>5} {'time':>8}")
    same: dict[tuple[str, str, int, int, str], int] = {}
    for c in colls:  # units of one size: one line
        key = (c.what, c.kind, c.nbytes, c.group, c.link)
        same[key] = same.get(key, 0) + c.count
    for (what, kind, nbytes, group, link), count in same.items():
        secs = count * est.machine.link(link).ring_time(nbytes, group, kind)
        lines.append(
            f"{what:<36} {kind:<14} {fmt_bytes(nbytes):>10} {group:>5} {link:>5} {count:>5} {seconds(secs):>8}"
        )
    return "\n".join(lines)
