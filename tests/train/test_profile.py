"""--metrics.profile: the interval arithmetic, the config check, the event rules on a hand-made trace, one
single-process fit, and one whole FSDP job on 2 ranks whose traces load and hold compute and communication."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from disttrain.config import from_dict
from disttrain.errors import ConfigError
from disttrain.testing.tiny import tiny_cli_args
from disttrain.train.profile import StepTimes, is_comm_op, length, overlap, step_times, subtract, union

from conftest import disttrain

pytestmark = [pytest.mark.timeout(300)]
LINE = re.compile(
    r"profile step (\d+): [\d.]+ ms, compute ([\d.]+) ms, communication ([\d.]+) ms, "
    r"([\d.]+) ms of it \((\d+)%\) hidden behind compute; trace (\S+)"
)


def test_overlap_arithmetic() -> None:
    assert overlap([(0, 10)], [(5, 20)]) == 5
    assert overlap([(0, 10)], [(10, 20)]) == 0
    assert overlap([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert overlap([(0, 10)], [(2, 4), (3, 6), (8, 12)]) == 6  # compute on two threads at once counts once
    assert union([(3, 6), (0, 1), (2, 4), (7, 7)]) == [(0, 1), (2, 6)]
    assert length([(0, 10), (5, 20), (30, 31)]) == 21
    assert subtract([(0, 10), (20, 30)], [(2, 3), (8, 22), (25, 40)]) == [(0, 2), (3, 8), (22, 25)]
    assert subtract([(0, 10)], []) == [(0, 10)] and subtract([(0, 10)], [(-5, 15)]) == []


@pytest.mark.parametrize("bad", ["8:5", "0:3", "5", "a:b", "3:"])
def test_config_check_says_rule_value_and_fix(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"metrics": {"profile": bad}})
    assert str(err.value) == (
        f"metrics.profile must be START:END with 1 <= START <= END, got {bad!r}; e.g. --metrics.profile 5:8"
    )
    assert from_dict({"metrics": {"profile": "5:8"}}).metrics.profile == "5:8"


def event(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def test_event_rules_on_a_hand_made_cpu_trace() -> None:
    trace = {
        "traceEvents": [
            event("step 3", 0, 100, cat="user_annotation"),
            event("aten::linear", 0, 40),  # ops inside ops: counted once
            event("aten::t", 0, 1),
            event("aten::addmm", 2, 38),
            event("c10d::_allgather_base_", 40, 2),  # enqueue on the main thread ...
            event("aten::copy_", 40.5, 1),  # ... whose copies are communication
            event("gloo:all_gather", 42, 30, tid=2, cat="user_annotation"),  # the transfer, on gloo's thread
            event("aten::copy_", 50, 5, tid=2),  # inside the transfer: not compute
            event("aten::mm", 50, 10),  # compute behind the transfer
            event("FSDP::all_gather_copy_out", 70, 8, cat="user_annotation"),  # neither
            event("aten::linalg_vector_norm", 80, 15),  # a DTensor op: a collective, a kernel, a wait
            event("_c10d_functional::all_reduce", 80, 1),
            event("aten::pow", 82, 3),
            event("_c10d_functional::wait_tensor", 86, 4),
            event("aten::mm", 120, 10),  # after the step: not counted
            event("step 4", 130, 10, cat="user_annotation"),
        ]
    }
    s3, s4 = step_times(trace)
    # compute [0,40] [50,60] [81,86] [90,95]; communication [40,72] [80,81] [86,90]; both [50,60]
    assert s3 == StepTimes(step=3, wall_ms=0.1, compute_ms=0.06, comm_ms=0.037, hidden_ms=0.01)
    assert s4 == StepTimes(step=4, wall_ms=0.01, compute_ms=0.0, comm_ms=0.0, hidden_ms=0.0)
    assert s3.line("t.json") == (
        "profile step 3: 0.1 ms, compute 0.1 ms, communication 0.0 ms, 0.0 ms of it (27%) hidden behind compute; "
        "trace t.json"
    )
    assert s4.line("t.json") == "profile step 4: 0.0 ms, compute 0.0 ms, no communication; trace t.json"
    assert is_comm_op("gloo:all_reduce") and is_comm_op("c10d::allreduce_") and not is_comm_op("FSDP::all_gather")


def test_event_rules_on_gpu_kernels() -> None:
    trace = {
        "traceEvents": [
            event("step 1", 0, 100, cat="user_annotation"),
            event("aten::mm", 0, 90),  # the launch: ignored when kernels are there
            event("ampere_sgemm_128x64_tn", 10, 40, tid=7, cat="kernel"),
            event("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 30, 40, tid=20, cat="kernel"),
        ]
    }
    (s,) = step_times(trace)
    assert (s.compute_ms, s.comm_ms, s.hidden_ms) == (0.04, 0.04, 0.02)


def test_single_process_fit_writes_a_trace(tiny_trainer: Callable[..., Any], tmp_path: Path, capsys) -> None:
    trainer = tiny_trainer(train={"steps": 4}, metrics={"profile": "2:3", "progress": "lines"}, run_dir=tmp_path)
    trainer.fit()
    trace = tmp_path / "profile" / "rank0.pt.trace.json"
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"step 2", "step 3", "aten::mm"} <= names and "step 1" not in names and "step 4" not in names
    out = capsys.readouterr().out
    assert re.search(rf"profile step 2: [\d.]+ ms, compute [\d.]+ ms, no communication; trace {trace}", out)
    assert "profile step 3:" in out and "profile step 4" not in out


def test_window_past_the_end(tiny_trainer: Callable[..., Any], tmp_path: Path, capsys) -> None:
    trainer = tiny_trainer(train={"steps": 2}, metrics={"profile": "5:8", "progress": "lines"}, run_dir=tmp_path)
    trainer.fit()
    assert "metrics.profile 5:8: the run ended after step 2, before step 5; nothing was recorded" in (
        capsys.readouterr().out
    )
    assert not (tmp_path / "profile").exists()


@pytest.mark.slow
def test_fsdp_job_on_two_ranks_writes_traces_with_compute_and_communication(tmp_path: Path, small_text: Path) -> None:
    run = ["--run.root", str(tmp_path), "--run.name", "prof", "--parallel.strategy", "fsdp", "--parallel.nproc", "2"]
    proc = disttrain(*tiny_cli_args(small_text, 5, *run, "--metrics.profile", "3:4", "--metrics.progress", "lines"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        events = json.loads((tmp_path / "prof" / "profile" / f"rank{rank}.pt.trace.json").read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        assert {"step 3", "step 4"} <= names and not {"step 2", "step 5"} & names
        assert names & {"aten::mm", "aten::addmm"}, sorted(names)[:50]
        assert any(is_comm_op(n) and "all_gather" in n for n in names), sorted(n for n in names if ":" in n)
    lines = LINE.findall(proc.stdout)
    assert [int(m[0]) for m in lines] == [3, 4], proc.stdout[-3000:]
    for _, compute, comm, hidden, _, trace in lines:
        assert float(compute) > 0 and float(comm) > 0 and 0 <= float(hidden) <= float(comm)
        assert trace == str(tmp_path / "prof" / "profile" / "rank0.pt.trace.json")
