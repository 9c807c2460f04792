"""A plan uses this machine's own figures (issue 27): on a machine with none cached, `estimate` and `run` measure
them first (links, compute rates, the framework time per operator, FSDP's fixed cost per unit: no constant
fitted on another CPU), once; the run's MFU uses the same cached peak as the plan; the predicted-vs-measured
table names its activations row for what it compares."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from disttrain.config import from_dict
from disttrain.jobs.framework_probe import op_seconds, unit_overhead
from disttrain.plan.machine import LinkFit, MachineProfile, load_machine, save_machine
from disttrain.plan.timing import OP_OVERHEAD_S, UNIT_OVERHEAD_S, resolve_machine

from conftest import disttrain

pytestmark = pytest.mark.timeout(180)


def empty_cache(tmp_path: Path) -> dict[str, str]:
    cache = tmp_path / "fresh-cache"
    cache.mkdir()
    os.environ["DISTTRAIN_CACHE_DIR"] = str(cache)  # the test's own (conftest restores it)
    return {"DISTTRAIN_CACHE_DIR": str(cache)}


def test_the_plan_uses_the_measured_framework_costs_not_the_constants(tmp_path: Path) -> None:
    empty_cache(tmp_path)
    link = LinkFit(100e-6, 1e9, 2)
    save_machine(
        MachineProfile("h", "cpu", "x", 2, {"fp32": 0.1}, {"intra": link}, op_overhead_s=2e-6, unit_overhead_s=7e-3)
    )
    prof = load_machine("h")
    assert prof is not None
    m = resolve_machine("cpu", "fp32", profile=prof, nproc=2)
    assert m.sources["framework"] == "doctor" and m.op_overhead_s == 2e-6
    assert m.unit_overhead_s(2) == pytest.approx(7e-3) and m.unit_overhead_s(4) == pytest.approx(14e-3)  # shared
    assert m.compute_s(0.0, 1000, 2) == pytest.approx(3 * 1000 * 2e-6)
    default = resolve_machine("cpu", "fp32", profile=None, nproc=2)
    assert default.sources["framework"] == "default"  # nothing cached for this host: the constants
    assert default.compute_s(0.0, 1000, 2) == pytest.approx(3 * 1000 * OP_OVERHEAD_S["cpu"])
    assert default.unit_overhead_s(2) == pytest.approx(UNIT_OVERHEAD_S["cpu"])
    assert prof.missing("fp32", 2) == ["element-wise rate"] and "FSDP cost per unit" not in prof.missing("fp32", 1)


def test_unit_overhead_takes_the_probes_collectives_out() -> None:
    link = LinkFit(200e-6, 1e9, 2)
    blocks, nbytes = 16, 4096
    many = (2 * blocks - 1) * link.ring_time(nbytes, 2, "all_gather") + blocks * link.ring_time(
        nbytes, 2, "reduce_scatter"
    )
    one = link.ring_time(blocks * nbytes, 2, "all_gather") + link.ring_time(blocks * nbytes, 2, "reduce_scatter")
    hooks = 1.5e-3 * (2 * blocks - 2)  # what the probe should find: 1.5 ms per unit pass
    probe = {
        "nranks": 2,
        "blocks": blocks,
        "block_bytes": nbytes,
        "per_block_s": 0.004 + many + hooks,
        "one_s": 0.004 + one,
    }
    assert unit_overhead(probe, link) == pytest.approx(1.5e-3)
    assert unit_overhead({**probe, "per_block_s": probe["one_s"]}, link) == 0.0  # noise never makes it negative


def test_op_seconds_is_a_few_microseconds() -> None:
    torch.set_num_threads(1)
    assert 2e-7 < op_seconds(iters=5) < 2e-4


def test_the_runs_mfu_uses_the_plans_cached_peak(tmp_path: Path) -> None:
    from disttrain.train.trainer import _peak

    empty_cache(tmp_path)
    cfg = from_dict({"precision": {"dtype": "fp32"}})
    assert not _peak(torch.device("cpu"), cfg)[1].startswith("doctor")  # nothing cached: measured here
    import socket

    save_machine(MachineProfile(socket.gethostname(), "cpu", "x", 2, {"fp32": 0.25}, {}))
    threads = torch.get_num_threads()
    peak, source = _peak(torch.device("cpu"), cfg)
    assert peak == pytest.approx(0.25 * threads) and source.startswith("doctor") and f"{threads} thread" in source
    forced = from_dict({"precision": {"dtype": "fp32"}, "metrics": {"peak_tflops": 3.0}})
    assert _peak(torch.device("cpu"), forced) == (3.0, "config")


def test_measured_activations_are_named_for_what_they_compare() -> None:
    from disttrain.plan.estimate import Layout, plan_job
    from disttrain.plan.render import compare, render
    from disttrain.train.loss import cross_entropy

    cfg = from_dict(
        {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "context": 16}, "precision": {"dtype": "fp32"}}
    )
    est = plan_job(cfg, Layout(2, 1, 8 * 2**30), cross_entropy)
    saved = est.profile.activations("none") - est.profile.backward_transient
    fake = {"params": 1, "grads": 1, "optimizer": 1, "activations_saved": saved, "peak": 1, "peak_source": "rss"}
    text, data = compare(est, {"ddp": fake})
    assert "activations saved" in text and "activations saved" in data["ddp"]
    plan_row = next(x for x in render(est).splitlines() if x.startswith("activations (AC none)"))
    total = " ".join(plan_row.split()[3:5])  # the DDP column
    assert f"the plan's activations row, {total}" in text, (plan_row, text)
    assert json.dumps(data)


@pytest.mark.slow
@pytest.mark.timeout(600)  # it measures the machine: minutes where other work shares it
def test_estimate_measures_a_machine_with_no_figures_once_and_run_predicts_the_same_step(
    tmp_path: Path, small_text: Path
) -> None:
    """On a machine with no figures cached, `estimate` measures them (every time figure this machine's, none a
    default); the run minutes later reads them, measures nothing, and its plan (memory_plan.txt) predicts the same
    step (once they disagreed 0.75 s against 1.64 s)."""
    from disttrain.testing.tiny import tiny_cli_args

    env = empty_cache(tmp_path)
    args = tiny_cli_args(small_text, 2, "--run.root", str(tmp_path), "--run.name", "r", "--parallel.nproc", "2")
    est = disttrain("estimate", *args[1:], "--parallel.strategy", "auto", env=env, timeout=300)
    assert est.returncode == 0, est.stderr
    assert "measuring this machine for the plan" in est.stderr and "measured in" in est.stderr, est.stderr
    prof = load_machine()
    assert prof is not None and prof.device == "cpu" and prof.missing("fp32", 2) == []
    assert prof.missing("bf16", 2) == []  # measured too, fast or emulated: a bf16 plan here measures nothing again
    assert prof.op_overhead_s > 0 and prof.unit_overhead_s >= 0 and "intra" in prof.links
    line = next(x for x in est.stdout.splitlines() if x.startswith("* predicted step"))
    assert "(default)" not in line.replace("efficiency 0.50 (default)", ""), line
    assert "framework" in line and "per operator" in line and "(doctor)" in line, line
    run = disttrain(*args, env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "measuring this machine" not in run.stderr, run.stderr

    def step_row(text: str) -> str:
        return next(x for x in text.splitlines() if x.startswith("step, no overlap"))

    assert step_row((tmp_path / "r" / "memory_plan.txt").read_text()) == step_row(est.stdout)
