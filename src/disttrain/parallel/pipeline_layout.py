"""The pipeline layout as plain facts, checked once before any worker starts: which schedule, how many
micro-batches, how many stages each rank holds, which blocks each stage runs and which stages a rank holds. No
torch.distributed import: the parent that resolves a job asks it (:mod:`disttrain.resolve`), and the workers
build the stages from it (:mod:`disttrain.parallel.pipeline`).

The split is by blocks, balanced by cost: the blocks' matmul weights, the first stage also paying for the
embeddings and the last for the final norm and the output head (their matmul is the vocabulary's width, often
the size of a block or more), so a big vocabulary moves blocks off the last stage. ``--parallel.pp-split``
overrides it with the block indices where stages 1, 2, ... begin (torchtitan's split points).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from disttrain.errors import ConfigError

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev")
"""The schedules of ``torch.distributed.pipelining`` a job can name (``auto`` picks one)."""

MULTI_STAGE = frozenset({"interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"})
"""Schedules that run several stages per rank (virtual stages: ``pp_stages_per_rank`` >= 2)."""

V_SHAPED = frozenset({"zbv", "dualpipev"})
"""Schedules that place exactly two stages per rank in a V: rank r holds stages r and 2 x pp - 1 - r."""


@dataclass(frozen=True)
class PipelineLayout:
    """A pipeline of ``pp`` ranks running ``stages`` stages (``stages_per_rank`` each) under ``schedule``, each
    step's local micro-batch cut into ``microbatches`` pieces; ``starts[s]`` is the first block of stage s."""

    pp: int
    schedule: str
    microbatches: int
    stages_per_rank: int
    starts: tuple[int, ...]
    n_blocks: int

    @property
    def stages(self) -> int:
        return self.pp * self.stages_per_rank

    def blocks_of(self, stage: int) -> range:
        """The blocks stage ``stage`` runs (indices into the whole model's blocks)."""
        end = self.starts[stage + 1] if stage + 1 < self.stages else self.n_blocks
        return range(self.starts[stage], end)

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stages pipeline rank ``pp_rank`` holds, in the order the schedule expects them."""
        if self.schedule in V_SHAPED:
            return [pp_rank, self.stages - 1 - pp_rank]
        return [pp_rank + v * self.pp for v in range(self.stages_per_rank)]

    def owner(self, stage: int) -> int:
        """The pipeline rank that holds ``stage``."""
        if self.schedule in V_SHAPED:
            return stage if stage < self.pp else self.stages - 1 - stage
        return stage % self.pp

    def describe(self) -> str:
        """'pp 2 (1f1b, 4 micro-batches; stages: blocks 0-2 | 3-5)'."""
        spans = " | ".join(_span(self.blocks_of(s)) for s in range(self.stages))
        per = f", {self.stages_per_rank} stages per rank" if self.stages_per_rank > 1 else ""
        return f"pp {self.pp} ({self.schedule}, {self.microbatches} micro-batches{per}; stages: blocks {spans})"


def _span(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}"


def plan_pipeline(
    pp: int,
    schedule: str,
    microbatches: int,
    stages_per_rank: int,
    split: str,
    costs: StageCosts,
    micro_batch: int,
) -> PipelineLayout:
    """The layout the config asks for, ``auto`` and 0 resolved, or a ConfigError naming the values and the fix
    (every one caught here would hang or fail inside torch's schedule otherwise)."""
    schedule = _schedule(schedule, stages_per_rank)
    v = stages_per_rank or (2 if schedule in MULTI_STAGE else 1)
    _check_stages_per_rank(schedule, v)
    stages = pp * v
    n_blocks = len(costs.blocks)
    if stages > n_blocks:
        raise ConfigError(
            f"pp {pp} x {v} stage(s) per rank is {stages} stages, but the model has {n_blocks} blocks: each stage "
            f"needs at least one; use at most {n_blocks} stages (parallel.pp x parallel.pp_stages_per_rank)"
        )
    m = microbatches or _auto_microbatches(micro_batch, stages)
    _check_microbatches(m, pp, stages, schedule, micro_batch)
    starts = _user_split(split, stages, n_blocks) if split else balanced_starts(costs, stages)
    return PipelineLayout(pp, schedule, m, v, starts, n_blocks)


def _schedule(name: str, stages_per_rank: int) -> str:
    if name == "auto":  # torchtitan's default for one stage per rank; interleaved where the user asks for more
        return "interleaved-1f1b" if stages_per_rank > 1 else "1f1b"
    if name not in SCHEDULES:
        raise ConfigError(f"parallel.pp_schedule must be auto or one of {', '.join(SCHEDULES)}; got {name!r}")
    return name


def _check_stages_per_rank(schedule: str, v: int) -> None:
    if schedule in V_SHAPED and v != 2:
        raise ConfigError(
            f"parallel.pp_schedule {schedule} places exactly 2 stages per rank (a V), got "
            f"parallel.pp_stages_per_rank {v}; set it to 2 (or 0: the schedule's own)"
        )
    if schedule in MULTI_STAGE and v < 2:
        raise ConfigError(
            f"parallel.pp_schedule {schedule} runs several stages per rank, got parallel.pp_stages_per_rank {v}; "
            "set it to 2 or more, or use gpipe or 1f1b for one stage per rank"
        )
    if schedule not in MULTI_STAGE and v > 1:
        raise ConfigError(
            f"parallel.pp_schedule {schedule} runs one stage per rank, got parallel.pp_stages_per_rank {v}; "
            "use interleaved-1f1b, looped-bfs, interleaved-zb (any count) or zbv / dualpipev (2) for more"
        )


def _auto_microbatches(micro_batch: int, stages: int) -> int:
    """The fewest micro-batches that keep the bubble small: at least twice the stages where the micro-batch
    divides so, else the smallest divisor of the micro-batch >= the stages, else every sample its own."""
    divisors = [d for d in range(1, micro_batch + 1) if micro_batch % d == 0]
    for want in (2 * stages, stages):
        fit = [d for d in divisors if d >= want]
        if fit:
            return fit[0]
    return micro_batch


def _check_microbatches(m: int, pp: int, stages: int, schedule: str, micro_batch: int) -> None:
    if m < 1:
        raise ConfigError(f"parallel.pp_microbatches must be >= 1 (0: auto), got {m}")
    need = stages if schedule in MULTI_STAGE else pp
    if schedule != "gpipe" and m < need:  # torchtitan #775: fewer micro-batches than stages hangs
        raise ConfigError(
            f"parallel.pp_microbatches {m} is fewer than the {need} pipeline stages {schedule} keeps in flight: "
            f"the schedule would wait forever; use at least {need} micro-batches (and a train.micro_batch they divide)"
        )
    if micro_batch % m:
        fits = [d for d in range(need, micro_batch + 1) if micro_batch % d == 0]
        raise ConfigError(
            f"train.micro_batch {micro_batch} does not divide into parallel.pp_microbatches {m} equal pieces; "
            f"micro-batch counts that divide it: {fits or 'none >= ' + str(need) + ' (raise train.micro_batch)'}"
        )


def _user_split(split: str, stages: int, n_blocks: int) -> tuple[int, ...]:
    try:
        points = [int(p) for p in split.replace(" ", "").split(",") if p]
    except ValueError:
        points = []
    ok = len(points) == stages - 1 and all(a < b for a, b in pairwise([0, *points, n_blocks]))
    if not ok:
        raise ConfigError(
            f"parallel.pp_split {split!r} must name the {stages - 1} block indices where stages 1..{stages - 1} "
            f"begin, increasing, each in 1..{n_blocks - 1} (the model has {n_blocks} blocks), e.g. "
            f"{','.join(str(s) for s in balanced_starts(StageCosts([1.0] * n_blocks), stages)[1:])}"
        )
    return (0, *points)


@dataclass(frozen=True)
class StageCosts:
    """What each piece of the model costs a stage per token (its matmul weights' elements: 2 FLOPs each)."""

    blocks: list[float]
    first: float = 0.0
    """The embeddings (a lookup: next to nothing)."""
    last: float = 0.0
    """The final norm and the output head."""


def balanced_starts(costs: StageCosts, stages: int) -> tuple[int, ...]:
    """Contiguous runs of blocks, one per stage, that make the costliest stage as cheap as it can be (the first
    stage also pays ``costs.first``, the last ``costs.last``); among splits as good, the most even one (the
    least sum of squared stage costs)."""
    n = len(costs.blocks)
    prefix = [0.0]
    for c in costs.blocks:
        prefix.append(prefix[-1] + c)

    def cost(i: int, j: int, stage: int) -> float:
        extra = (costs.first if stage == 0 else 0.0) + (costs.last if stage == stages - 1 else 0.0)
        return prefix[j] - prefix[i] + extra

    worst = (float("inf"), float("inf"))
    # best[s][j]: (the costliest stage, the sum of squares) of the first s stages over blocks [0, j)
    best = [[worst] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0.0)
    for s in range(1, stages + 1):
        for j in range(s, n - (stages - s) + 1):
            for i in range(s - 1, j):
                c = cost(i, j, s - 1)
                value = (max(best[s - 1][i][0], c), best[s - 1][i][1] + c * c)
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    starts, j = [], n
    for s in range(stages, 0, -1):
        j = cut[s][j]
        starts.append(j)
    return tuple(reversed(starts))
