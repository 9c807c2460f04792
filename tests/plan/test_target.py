"""Planning a GPU cluster from a machine without GPUs gives the plan a GPU machine would (issue 27): precision
``auto`` is decided for the target device, and a plan where only offload fits says how to fit."""

from __future__ import annotations

import json

import pytest

from conftest import disttrain

pytestmark = pytest.mark.timeout(120)
GIB = 2**30
# a 64B model on 4 nodes of 8 GPUs with 80 GiB each, planned from this CPU machine
CLUSTER = ["--parallel.nproc", "8", "--launch.nnodes", "4", "--parallel.device-memory", "80GiB"]
CLUSTER += ["--parallel.device", "cuda", "--model.n-layers", "80", "--model.d-model", "8192", "--model.n-heads", "64"]


@pytest.mark.slow
def test_a_gpu_cluster_is_planned_in_bf16_from_a_cpu_machine() -> None:
    # forced: the plan stays at tp 1 (auto moves to tensor parallelism here: the test below)
    forced = ["--parallel.strategy", "fsdp"]
    text, js = (disttrain("estimate", *CLUSTER, *forced, *extra) for extra in ([], ["--json"]))
    assert text.returncode == 0 and js.returncode == 0, text.stderr + js.stderr
    assert "bf16 compute" in text.stdout, text.stdout[:400]  # was fp32: auto decided for the laptop
    out = json.loads(js.stdout)
    fsdp = out["strategies"]["fsdp"]
    assert round(fsdp["total"] / GIB, 2) == 80.37 and not fsdp["fits"]
    assert round(out["step_time"]["fsdp"]["sent_inter"] / GIB, 2) == 463.63
    # only offload fits: the recommendation and a `to fit` line say so (it once said `nothing fits`, no fix)
    assert out["strategies"]["fsdp_offload"]["fits"]
    assert "FSDP with --parallel.offload fits (50.36 GiB on the device)" in out["recommendation"]["reason"]
    assert "to fit: --parallel.activation_checkpointing full" in text.stdout
    assert "nothing fits without tensor parallelism" in out["recommendation"]["reason"]
    assert "run with --parallel.tp 8" in out["recommendation"]["reason"]


@pytest.mark.slow
def test_auto_moves_to_tensor_parallelism_where_nothing_fits_without() -> None:
    out = json.loads(disttrain("estimate", *CLUSTER, "--json").stdout)
    assert out["layout"]["tp"] == 8 and [o["tp"] for o in out["tp_options"]] == [1, 2, 4, 8]
    assert out["recommendation"]["reason"].startswith("tp 8: nothing fits without tensor parallelism")
    assert out["strategies"][out["recommendation"]["strategy"]]["fits"]


@pytest.mark.slow
def test_explain_does_not_call_a_grouping_that_does_not_fit_one_that_fits() -> None:
    proc = disttrain("estimate", *CLUSTER, "--parallel.strategy", "fsdp", "--explain")
    assert proc.returncode == 0, proc.stderr
    assert "chosen: 1 block(s) per unit — no grouping fits" in proc.stdout, proc.stdout[-3000:]


def test_a_bandwidth_or_a_memory_without_a_unit_is_an_error() -> None:
    """`--bandwidth 25` was read as 25 bytes/s (1.3e+06 s/step, exit 0)."""
    bandwidth = disttrain("estimate", "--bandwidth", "25")
    assert (
        bandwidth.returncode == 2 and "cannot read '25' as a bandwidth; write a number and a unit" in bandwidth.stderr
    )
    memory = disttrain("estimate", "--parallel.device-memory", "80")
    assert memory.returncode == 2 and "cannot read '80' as a size" in memory.stderr and "GB/GiB" in memory.stderr
