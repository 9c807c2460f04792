"""Predicted step time per strategy: compute from the profile's FLOPs, communication from the collectives
:mod:`disttrain.plan.comm` lists, timed on the machine's links (:mod:`disttrain.plan.machine`: what
``disttrain doctor`` measured, or ``--bandwidth``), plus FSDP's fixed cost per unit and pass.

- compute = FLOPs per rank and step / (matmul peak x the efficiency a training step reaches), plus the
  elements the element-wise operators write / the rate ``doctor`` measured, plus a fixed framework time per
  operator; on CPU, ranks that share cores share their FLOP/s;
- the optimizer step = the parameters a rank holds x its element-wise work per parameter, at the same rate;
- communication = the sum over collectives of ring time ``(g-1) x (latency + bytes / g / bandwidth)``;
- with overlap (NCCL on its own streams): only the first all-gather, the last reduce-scatter and what the
  compute of a pass cannot cover stay exposed; without (gloo on CPU: the collectives run on the cores that
  compute, measured 4% hidden) everything adds up. ``predicted`` is the one that applies to the device.

Also the two knobs the plan resolves for FSDP: how many adjacent blocks one unit holds (:func:`best_grouping`:
the fewest that come within 1% of the fastest grouping that fits in memory) and the prefetch depth that hides
an all-gather behind the previous unit's compute.
May import: ``disttrain.config``, ``disttrain.utils``, ``disttrain.plan.profile``, ``disttrain.plan.comm``,
``disttrain.plan.machine``, ``disttrain.plan.tp``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from disttrain.config import JobConfig
from disttrain.parallel.strategies import COLUMNS
from disttrain.plan.comm import Collective, accum_steps, collectives, unit_numels
from disttrain.plan.machine import LinkFit, MachineProfile, load_machine, parse_bandwidth, save_machine
from disttrain.plan.profile import ModelProfile, sharded_bytes
from disttrain.plan.tp import tp_collectives

# Fraction of the matmul peak a training step's counted FLOPs reach when nothing better is known (measured:
# the default GPT, one process, fp32 on a 2-core AVX2 EPYC; torchtitan-class GPU jobs reach ~0.4 of bf16 peak).
DEFAULT_EFFICIENCY = {"cpu": 0.5, "cuda": 0.4}
# FSDP2's fixed cost per unit and pass (pre/post hooks, copy-in/copy-out, DTensor views) on a core of its own
# (ranks that share cores take longer: Machine.unit_overhead_s), measured on CPU by benchmarks/bench_plan_time.py
# (24 blocks of width 128, one unit per block vs one unit: 3 ms at 2 ranks on 2 cores, 6 ms at 4); on CUDA it
# is hidden behind the kernel queue.
UNIT_OVERHEAD_S = {"cpu": 3e-3, "cuda": 1e-4}
# Framework time per dispatched operator (Python, dispatcher, autograd bookkeeping, the kernel launch): what a
# small model's step is made of. On a CPU it adds to the FLOPs' time; on CUDA the launches run ahead of the
# kernels, so the step is the longer of the two (measured on an H200: the default GPT at micro-batch 32 takes
# 10 ms for 1 ms of FLOPs: ~1,000 operators of ~10 us).
OP_OVERHEAD_S = {"cpu": 12e-6, "cuda": 10e-6}
# Elements per second of a block's element-wise work when doctor measured none: one thread of this 2-core EPYC
# (bf16 and fp32 alike), and an HBM GPU's ~4 TB/s over ~8 bytes read and written per element.
DEFAULT_ELEMENTWISE_RATE = {"cpu": 2e9, "cuda": 5e11}
# The optimizer step's element-wise work per parameter a rank holds, in elements of the measured element-wise
# rate: torch's AdamW 5.6-6.6 here (for-loop; fused and foreach, which the Trainer uses, do less), the global
# grad-norm clip 0.8-1.0, zeroing the gradients.
OPTIMIZER_ELEMENTS_PER_PARAM = 8
# Links assumed when nothing was measured and no --bandwidth was given: gloo over loopback; NVLink; 100 Gbit/s.
DEFAULT_LINKS = {
    "cpu": {"intra": (100e-6, 1e9), "inter": (200e-6, 0.125e9)},
    "cuda": {"intra": (10e-6, 100e9), "inter": (20e-6, 12.5e9)},
}
# gloo's collectives are not rings of one rate: as rings, its reduce-scatter runs at 0.3-0.6x its all-gather's
# bandwidth and its all-reduce at 1.2-1.6x (doctor -n 2 and -n 4 here); NCCL's are rings.
DEFAULT_KIND_RATES = {"cpu": {"reduce_scatter": 0.5, "all_reduce": 1.5}, "cuda": {}}
DEFAULT_TFLOPS = {
    "cpu": {"fp32": 0.08, "bf16": 0.5, "fp16": 0.08},
    "cuda": {"fp32": 400.0, "bf16": 800.0, "fp16": 800.0},
}
NEAR_BEST = 0.01


@dataclass(frozen=True)
class Machine:
    """What the prediction needs about where the job runs, and where each figure came from."""

    device: str
    tflops: float
    """Matmul peak of one thread (CPU) or one device (CUDA), in the compute dtype."""
    efficiency: float
    cores: int
    links: dict[str, LinkFit]
    sources: dict[str, str] = field(default_factory=dict)
    elementwise_rate: float = 0.0
    """Elements per second of element-wise work, one thread (CPU) or one device (CUDA); 0: not counted."""
    op_overhead_s: float = 0.0
    """Framework time per forward operator (0: :data:`OP_OVERHEAD_S`'s default for the device)."""
    unit_overhead_base_s: float = 0.0
    """FSDP2's fixed cost per unit pass on a core of its own (0: :data:`UNIT_OVERHEAD_S`'s default)."""

    @property
    def overlap(self) -> bool:
        """Whether collectives run beside compute (NCCL streams) rather than on the computing cores (gloo)."""
        return self.device == "cuda"

    def link(self, name: str) -> LinkFit:
        return self.links.get(name) or self.links["intra"]

    def core_share(self, nproc: int) -> tuple[int, float]:
        """(threads per rank, the share of a core each thread gets): on CPU, ranks x threads beyond the cores
        share them."""
        if self.device != "cpu":
            return 1, 1.0
        threads = max(1, self.cores // max(nproc, 1))
        return threads, min(1.0, self.cores / (nproc * threads))

    def rank_flops(self, nproc: int) -> float:
        """FLOP/s one rank reaches."""
        threads, share = self.core_share(nproc)
        return self.tflops * 1e12 * self.efficiency * threads * share

    def unit_overhead_s(self, nproc: int) -> float:
        """FSDP's fixed cost of one unit's pass on one rank (on CPU, ranks that share cores share that time)."""
        return (self.unit_overhead_base_s or UNIT_OVERHEAD_S[self.device]) / self.core_share(nproc)[1]

    def elementwise_s(self, elements: float, nproc: int) -> float:
        """Seconds one rank takes to write ``elements`` in element-wise work (0 where no rate is known)."""
        threads, share = self.core_share(nproc)
        return elements / (self.elementwise_rate * threads * share) if self.elementwise_rate > 0 else 0.0

    def compute_s(self, flops: float, ops: int, nproc: int, elements: int = 0) -> float:
        """Seconds of one rank's compute: its matmul FLOPs at the rate it reaches, plus the element-wise work
        (the forward's ``elements``, about twice that in backward) at the measured rate; and the framework time
        of the operators forward and backward dispatch (about twice the forward's in backward): added on a CPU,
        the longer of the two on CUDA (launches run ahead of the kernels)."""
        _, share = self.core_share(nproc)
        kernels_s = flops / self.rank_flops(nproc) + self.elementwise_s(3 * elements, nproc)
        ops_s = 3 * ops * (self.op_overhead_s or OP_OVERHEAD_S[self.device]) / share
        return max(kernels_s, ops_s) if self.device == "cuda" else kernels_s + ops_s


def resolve_machine(
    device: str,
    dtype: str,
    *,
    bandwidth: str | None = None,
    inter_bandwidth: str | None = None,
    profile: MachineProfile | None = None,
    measure_peak: bool = False,
    nproc: int | None = None,
) -> Machine:
    """The machine for a plan: this host's cached doctor figures (when they are for ``device``; a link measured
    over ``nproc`` ranks, ``intra@N``, before the last one measured), overridden by ``--bandwidth`` /
    ``--inter-node-bandwidth``, else defaults (said so in ``sources``)."""
    prof = profile if profile is not None else load_machine()
    if prof is not None and prof.device != device:
        prof = None
    sources: dict[str, str] = {}
    links: dict[str, LinkFit] = {}
    for name, (lat, bw) in DEFAULT_LINKS[device].items():
        measured = (prof.links.get(f"{name}@{nproc}") or prof.links.get(name)) if prof else None
        kinds = {k: (lat, bw * r) for k, r in DEFAULT_KIND_RATES[device].items()}
        links[name] = measured or LinkFit(lat, bw, 2, source="default", by_kind=kinds)
        sources[name] = "doctor" if measured else "default"
    for name, text, flag in (("intra", bandwidth, "--bandwidth"), ("inter", inter_bandwidth, "--inter-node-bandwidth")):
        if text:
            links[name] = LinkFit(links[name].latency_s, parse_bandwidth(text, flag), links[name].nranks, source=flag)
            sources[name] = flag
    tflops = prof.matmul_tflops.get(dtype) if prof else None
    sources["peak"] = "doctor" if tflops else "default"
    if not tflops and device == "cuda":
        tflops, sources["peak"] = _gpu_table_peak(dtype)
    if not tflops and measure_peak and device == "cpu":
        tflops, sources["peak"] = _measure_cpu_peak(dtype), "measured now"
    tflops = tflops or DEFAULT_TFLOPS[device].get(dtype, DEFAULT_TFLOPS[device]["fp32"])
    eff = prof.efficiency.get(dtype) if prof else None
    sources["efficiency"] = "estimate --measure" if eff else "default"
    cores = prof.cores if prof else (os.cpu_count() or 1)
    rate = prof.elementwise_rate.get(dtype) if prof else None
    sources["elementwise"] = "doctor" if rate else "default"
    rate = rate or DEFAULT_ELEMENTWISE_RATE[device]
    op_s, unit_s = (prof.op_overhead_s, prof.unit_overhead_s) if prof else (0.0, 0.0)
    sources["framework"] = "doctor" if op_s and unit_s else "default"
    eff = eff or DEFAULT_EFFICIENCY[device]
    return Machine(device, float(tflops), eff, cores, links, sources, rate, op_s, unit_s)


def _gpu_table_peak(dtype: str) -> tuple[float | None, str]:
    """This machine's GPU from the table of known peaks (dense bf16; fp32 half of it), when there is one."""
    import torch

    from disttrain.utils.peak import gpu_peak_tflops

    if not torch.cuda.is_available():
        return None, "default"
    name = torch.cuda.get_device_name(0)
    known = gpu_peak_tflops(name)
    if known is None:
        return None, "default"
    return (known / 2 if dtype == "fp32" else known), f"table: {name}"


EFFICIENCY_RUNS = 5
"""How many of the latest learned efficiencies per dtype the cache keeps; the plan uses their median."""


def remember_efficiency(machine: Machine, dtype: str, efficiency: float) -> float:
    """Cache the compute efficiency measured steps reached on this machine (``estimate --measure``); return the
    one later plans use: the median of this and the previous runs' (the last :data:`EFFICIENCY_RUNS`)."""
    import dataclasses
    import socket
    import statistics

    prof = load_machine() or MachineProfile(socket.gethostname(), machine.device, "", machine.cores, {}, {})
    runs = [*prof.efficiency_runs.get(dtype, []), round(efficiency, 4)][-EFFICIENCY_RUNS:]
    used = round(statistics.median(runs), 4)
    save_machine(
        dataclasses.replace(
            prof, efficiency={**prof.efficiency, dtype: used}, efficiency_runs={**prof.efficiency_runs, dtype: runs}
        )
    )
    return used


def forget_efficiency() -> str:
    """``estimate --reset-measurements``: drop the compute efficiency learned from measured runs on this machine
    (later plans use the default again); the line that says what was dropped."""
    import dataclasses

    prof = load_machine()
    if prof is None or not prof.efficiency_runs:
        return "no learned compute efficiency to reset on this machine"
    runs = ", ".join(f"{d}: {len(v)} run(s), {prof.efficiency.get(d, 0):.2f}" for d, v in prof.efficiency_runs.items())
    path = save_machine(dataclasses.replace(prof, efficiency={}, efficiency_runs={}))
    return f"reset the learned compute efficiency ({runs}) in {path}; plans use the default again"


def _measure_cpu_peak(dtype: str) -> float:
    import torch

    from disttrain.config import DTYPES
    from disttrain.utils.peak import measure_matmul_tflops, one_thread

    with one_thread():
        return measure_matmul_tflops(torch.device("cpu"), DTYPES[dtype], seconds=0.2)


@dataclass(frozen=True)
class StepTime:
    """One strategy's predicted optimizer step on this layout."""

    strategy: str
    blocks_per_unit: int
    prefetch: int
    compute_s: float
    comm_s: float
    overhead_s: float
    exposed_s: float
    """Communication left exposed with overlap."""
    sent_intra: float
    sent_inter: float
    calls: int
    overlap: bool
    framework_s: float = 0.0
    """The part of ``compute_s`` that is not matmul FLOPs: per-operator framework time and element-wise work."""
    optimizer_s: float = 0.0
    """The optimizer step and gradient clipping over the parameters this rank holds, after the last collective."""

    @property
    def no_overlap_s(self) -> float:
        return self.compute_s + self.comm_s + self.overhead_s + self.optimizer_s

    @property
    def overlap_s(self) -> float:
        return self.compute_s + self.overhead_s + self.exposed_s + self.optimizer_s

    @property
    def predicted_s(self) -> float:
        return self.overlap_s if self.overlap else self.no_overlap_s

    def to_json(self) -> dict[str, float | int | str | bool]:
        keys = (
            "strategy",
            "blocks_per_unit",
            "prefetch",
            "compute_s",
            "comm_s",
            "overhead_s",
            "exposed_s",
            "optimizer_s",
            "sent_intra",
            "sent_inter",
            "calls",
            "overlap",
        )
        return {k: getattr(self, k) for k in keys} | {
            "no_overlap_s": self.no_overlap_s,
            "overlap_s": self.overlap_s,
            "predicted_s": self.predicted_s,
        }


def _time(c: Collective, machine: Machine) -> float:
    return c.count * machine.link(c.link).ring_time(c.nbytes, c.group, c.kind)


def step_time(
    strategy: str,
    prof: ModelProfile,
    cfg: JobConfig,
    machine: Machine,
    nproc: int,
    nnodes: int,
    blocks_per_unit: int,
    tp: int = 1,
) -> StepTime:
    """Predicted time of one optimizer step of ``strategy`` (a plan column) with ``blocks_per_unit``. With
    ``tp`` > 1, ``nproc`` counts the data-parallel ranks (TP groups) per node, ``prof`` is what one rank of a
    TP group holds (:func:`~disttrain.plan.tp.local_profile`), and TP's collectives
    (:func:`~disttrain.plan.tp.tp_collectives`) add to the step: they sit between a block's matmuls, so
    nothing hides them (gloo or NCCL alike)."""
    world = nproc * nnodes  # data-parallel ranks
    ranks = nproc * tp  # ranks per node that share its cores
    column = COLUMNS[strategy]
    sharded = column.sharded and world > 1
    shard = column.shard_degree(nproc, nnodes)
    accum = accum_steps(cfg, world)  # every strategy here is data parallel over all TP groups
    compute = machine.compute_s(
        prof.train_flops * accum, prof.forward_ops * accum, ranks, prof.forward_elements * accum
    )
    framework = compute - machine.compute_s(prof.train_flops * accum, 0, ranks)
    colls = collectives(strategy, prof, cfg, nproc, nnodes, blocks_per_unit)
    comm = sum(_time(c, machine) for c in colls)
    overhead, exposed, prefetch = 0.0, comm, 0
    if sharded:
        _, units = unit_numels(prof, shard, blocks_per_unit, cfg.parallel.root_units)
        passes = sum(c.count for c in colls if c.kind == "all_gather")
        overhead = passes * machine.unit_overhead_s(ranks)
        exposed, prefetch = _fsdp_exposed(colls, compute, accum, len(units) + 1, machine)
    elif world > 1:
        exposed = _ddp_exposed(colls, compute / accum, machine)
    tp_colls = tp_collectives(prof, cfg, tp, world)
    tp_comm = sum(_time(c, machine) for c in tp_colls)
    comm, exposed, colls = comm + tp_comm, exposed + tp_comm, colls + tp_colls
    sent = {"intra": 0.0, "inter": 0.0}
    for c in colls:
        sent[c.link] += c.sent
    held = sharded_bytes(prof.params, shard if sharded else 1, 1, trainable_only=True)  # elements: 1 byte each
    optimizer = machine.elementwise_s(OPTIMIZER_ELEMENTS_PER_PARAM * held, ranks)
    return StepTime(
        strategy,
        blocks_per_unit if column.sharded else 0,
        prefetch,
        compute,
        comm,
        overhead,
        exposed,
        sent["intra"],
        sent["inter"],
        sum(c.count for c in colls),
        machine.overlap,
        framework,
        optimizer,
    )


def _fsdp_exposed(
    colls: list[Collective], compute: float, accum: int, n_units: int, machine: Machine
) -> tuple[float, int]:
    """Exposed communication with overlap, and the prefetch depth that hides the all-gathers. With overlap,
    each micro-step's first all-gather and the step's last reduce-scatter are exposed, and whatever the compute
    cannot cover; a unit's all-gather hides behind the forward of the ``depth`` units before it (forward is
    about a third of a unit's compute)."""
    gathers = [c for c in colls if c.kind == "all_gather" and c.count]
    rest = [c for c in colls if c.kind != "all_gather" and c.count]
    total = sum(_time(c, machine) for c in colls)
    first = max((_time(c, machine) / c.count for c in gathers), default=0.0)
    last = max((_time(c, machine) / c.count for c in rest), default=0.0)
    gather_calls = sum(c.count for c in gathers) or 1
    per_gather = sum(_time(c, machine) for c in gathers) / gather_calls
    per_unit_forward = compute / accum / max(n_units, 1) / 3
    depth = max(1, min(4, math.ceil(per_gather / max(per_unit_forward, 1e-12))))
    exposed = first * accum + last + max(0.0, total - first * accum - last - compute)
    return min(exposed, total), depth


def _ddp_exposed(colls: list[Collective], micro_compute: float, machine: Machine) -> float:
    """DDP all-reduces buckets while the last micro-step's backward (2/3 of its compute) runs: the last bucket
    and what backward cannot cover stay exposed."""
    total = sum(_time(c, machine) for c in colls)
    last_bucket = max((_time(c, machine) / c.count for c in colls if c.count), default=0.0)
    return min(total, last_bucket + max(0.0, total - last_bucket - micro_compute * 2 / 3))


def grouping_candidates(n_blocks: int) -> list[int]:
    """Blocks per unit worth trying: each distinct number of units once (1, 2, 3, 4, 6, ... blocks)."""
    seen: dict[int, int] = {}
    for k in range(1, max(n_blocks, 1) + 1):
        seen.setdefault(math.ceil(n_blocks / k), k)
    return sorted(seen.values())


def best_grouping(times: dict[int, StepTime], fits: dict[int, bool]) -> int:
    """The fewest blocks per unit whose predicted step is within 1% of the fastest grouping that fits (fewer
    blocks per unit: less gathered memory, more to overlap); 1 if none fits."""
    ok = [k for k in sorted(times) if fits.get(k)]
    if not ok:
        return 1
    best = min(times[k].predicted_s for k in ok)
    return next(k for k in ok if times[k].predicted_s <= best * (1 + NEAR_BEST))
