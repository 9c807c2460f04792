"""``--metrics.profile START:END``: torch.profiler around those steps, one Chrome/Perfetto trace per rank
(``<run>/profile/rank{r}.pt.trace.json``), and per step how its time splits between compute and communication and
how much of the communication ran hidden behind compute (the figure that says whether prefetching works).

:class:`StepProfiler` owns the profiler's life (started before step START, stopped and exported after step END
or when the run ends inside the window), the ``step k`` range around each step, and rank 0's console lines.
The rest of the module reads a trace back into :class:`StepTimes`.

Which events are which, per ``step k`` range (the figures are lengths of unions of intervals, so nested or
parallel events are not counted twice):

* With GPU kernels in the trace (``cat == "kernel"``), the device timeline decides: kernels whose name contains
  ``nccl`` are communication, every other kernel is compute; CPU-side events (launches) are ignored.
* Otherwise (CPU, gloo), communication is the process group's own ranges, ``gloo:<collective>`` /
  ``nccl:<collective>``, which span the transfer on the group's worker threads (gloo runs FSDP's reduce-scatter
  as ``gloo:all_reduce``), plus the collective ops on the calling thread: ``c10d::<collective>`` (the enqueue)
  and ``_c10d_functional::<op>`` (DTensor's, e.g. the grad norm; ``wait_tensor`` is a blocking wait). Compute
  is the time a thread spends in ``aten::`` ops minus the time that thread spends in communication ops (so a
  gloo worker's copies and a DTensor op's collective and wait are not compute, the rest of that op is). FSDP's
  ``FSDP::all_gather`` / ``FSDP::pre_forward`` user ranges are neither: they wrap copy-in/copy-out work (its
  ``aten::`` ops are compute) and waits (when only a worker thread's communication runs: exposed communication).

Hidden = the part of the communication time during which compute ran on any thread or stream.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from disttrain.config.sections import profile_window

Interval = tuple[float, float]
"""[start, end) in microseconds, the trace's unit."""

STEP_NAME = re.compile(r"step (\d+)")
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "_c10d_functional::", "c10d_functional::")


@dataclass
class StepTimes:
    """One profiled step of one rank, in milliseconds."""

    step: int
    wall_ms: float
    compute_ms: float
    comm_ms: float
    hidden_ms: float

    def line(self, trace: Path | str) -> str:
        """The console line: ``profile step 6: 52.1 ms, compute 41.2 ms, communication 12.3 ms, ...``."""
        head = f"profile step {self.step}: {self.wall_ms:.1f} ms, compute {self.compute_ms:.1f} ms, "
        if self.comm_ms <= 0:
            return head + f"no communication; trace {trace}"
        share = self.hidden_ms / self.comm_ms
        return (
            head + f"communication {self.comm_ms:.1f} ms, {self.hidden_ms:.1f} ms of it ({share:.0%}) "
            f"hidden behind compute; trace {trace}"
        )


# -- interval arithmetic ---------------------------------------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points (empty ones dropped)."""
    out: list[Interval] = []
    for lo, hi in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def length(intervals: Iterable[Interval]) -> float:
    """Total length covered by ``intervals``."""
    return sum(hi - lo for lo, hi in union(intervals))


def overlap(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Length covered by both ``a`` and ``b``: e.g. comm [0, 10] and compute [5, 20] -> 5."""
    ua, ub = union(a), union(b)
    i = j = 0
    total = 0.0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        total += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """``intervals`` cut to [lo, hi] (those outside dropped)."""
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The points of ``a`` not in ``b``: e.g. [0, 10] minus [2, 3] and [8, 12] -> [0, 2], [3, 8]."""
    out: list[Interval] = []
    ub = union(b)
    j = 0
    for lo, hi in union(a):
        while j < len(ub) and ub[j][1] <= lo:
            j += 1
        k = j
        while k < len(ub) and ub[k][0] < hi:
            if ub[k][0] > lo:
                out.append((lo, ub[k][0]))
            lo = max(lo, ub[k][1])
            k += 1
        if lo < hi:
            out.append((lo, hi))
    return out


# -- reading a trace -------------------------------------------------------------------------------------------


def is_comm_kernel(name: str) -> bool:
    return "nccl" in name.lower()


def is_comm_op(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def classify(events: list[dict[str, Any]]) -> tuple[list[Interval], list[Interval]]:
    """(compute, communication) intervals of a trace's complete events, by the rules in the module docstring."""
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:
        comm = [span(e) for e in kernels if is_comm_kernel(e["name"])]
        return [span(e) for e in kernels if not is_comm_kernel(e["name"])], comm
    comm_by_thread: dict[Any, list[Interval]] = defaultdict(list)
    ops_by_thread: dict[Any, list[Interval]] = defaultdict(list)
    for e in events:
        if is_comm_op(e["name"]):
            comm_by_thread[thread(e)].append(span(e))
        elif e.get("cat") == "cpu_op" and e["name"].startswith("aten::"):
            ops_by_thread[thread(e)].append(span(e))
    compute = [iv for k, ops in ops_by_thread.items() for iv in subtract(ops, comm_by_thread.get(k, []))]
    return compute, [iv for v in comm_by_thread.values() for iv in v]


def thread(e: dict[str, Any]) -> tuple[Any, Any]:
    return e.get("pid"), e.get("tid")


def span(e: dict[str, Any]) -> Interval:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def step_times(trace: dict[str, Any]) -> list[StepTimes]:
    """Per ``step k`` range of a Chrome trace (as ``export_chrome_trace`` writes it), in the order they ran."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e and "name" in e]
    steps = [
        (int(m.group(1)), span(e))
        for e in events
        if e.get("cat") == "user_annotation" and (m := STEP_NAME.fullmatch(e["name"]))
    ]
    compute, comm = classify(events)
    out = []
    for step, (lo, hi) in sorted(steps, key=lambda s: s[1]):
        cpt, com = clip(compute, lo, hi), clip(comm, lo, hi)
        out.append(StepTimes(step, (hi - lo) / 1e3, length(cpt) / 1e3, length(com) / 1e3, overlap(com, cpt) / 1e3))
    return out


# -- the profiler ----------------------------------------------------------------------------------------------


class StepProfiler:
    """torch.profiler over steps START..END of ``metrics.profile``; the loop calls before/after each step."""

    def __init__(
        self, spec: str, rank: int, run_dir: Path | None, cuda: bool, say: Callable[[str], None] = print
    ) -> None:
        window = profile_window(spec)
        assert window is not None, spec  # MetricsConfig checked it
        self.spec, (self.start, self.end) = spec, window
        self.rank, self.cuda, self.say = rank, cuda, say
        self.trace = (run_dir if run_dir is not None else Path()) / "profile" / f"rank{rank}.pt.trace.json"
        self.prof: torch.profiler.profile | None = None
        self.range: Any = None
        self.done = False
        self.first_step: int | None = None
        self.last_step = 0

    def before_step(self, step: int) -> None:
        """Start the profiler before step START (or the first step after it, on a resume) and open ``step k``."""
        if self.first_step is None:
            self.first_step = step
        if self.done or not self.start <= step <= self.end:
            return
        if self.prof is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
            self.prof.start()
        self.range = torch.profiler.record_function(f"step {step}")
        self.range.__enter__()

    def after_step(self, step: int) -> float:
        """Close ``step k``; after step END stop, export and report. Returns the seconds that took (not training)."""
        self.last_step = step
        if self.range is not None:
            self.range.__exit__(None, None, None)
            self.range = None
        if self.prof is None or step < self.end:
            return 0.0
        t0 = time.perf_counter()
        self.finish()
        return time.perf_counter() - t0

    def close(self) -> None:
        """The run ends: export what was recorded if the window is still open (or say it never opened)."""
        if self.done:
            return
        if self.range is not None:  # a step raised inside its range
            self.range.__exit__(None, None, None)
            self.range = None
        if self.prof is not None:
            self.finish()
        elif self.rank == 0:
            self.say(f"metrics.profile {self.spec}: {self.missed()}; nothing was recorded")
        self.done = True

    def missed(self) -> str:
        """Why the window never opened."""
        if self.first_step is None:
            return "no step ran"
        if self.first_step > self.end:
            return f"the run started at step {self.first_step}, after the window"
        return f"the run ended after step {self.last_step}, before step {self.start}"

    def finish(self) -> None:
        """Stop, write this rank's trace, and on rank 0 print one line per recorded step."""
        assert self.prof is not None
        self.prof.stop()
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        self.prof.export_chrome_trace(str(self.trace))
        self.prof, self.done = None, True
        if self.rank != 0:
            return
        for times in step_times(json.loads(self.trace.read_text())):
            self.say(times.line(self.trace))
