"""The memory plan against what real gloo ranks hold: 2 and 4 ranks, DDP and FSDP (with and without reshard),
and tensor parallelism at tp 1 / 2 / 4 on a model wide enough that its states dwarf a process's own costs.

One launch per world size runs every strategy and layout (scenario-style); the plan is computed here, in the
test process, from the same configs. Parameters, gradients and optimizer state must match within 5% (they are
exact byte counts on both sides), and FSDP's must be at most 1/N of DDP's plus the padding of uneven shards;
under TP the total peak (the RSS peak above the process before the model was built) must be within the plan's
stated error, TP_PEAK_ERROR.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from disttrain.config import from_dict
from disttrain.launch.torchrun import run_module_captured
from disttrain.plan.estimate import GiB, Layout, plan_job
from disttrain.testing.tiny import tiny_config
from disttrain.train.loss import cross_entropy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
STRATEGIES = ["ddp", "fsdp", "fsdp_no_reshard"]
EXACT_ROWS = ("params", "grads", "optimizer")


TP_PEAK_ERROR = 0.15
"""The TP total peak's error the docs state (docs/parallelism.md): measured -1% / -5% / -9% at tp 1 / 2 / 4 on
the wide model here; what the plan leaves out is the process's own growth once it trains (~25-30 MiB)."""


def small(data: Path, n: int) -> dict[str, Any]:
    # width 96 over 4 ranks: dim 0 of the (65, 96) embedding and head shards unevenly (17 rows, padded)
    return tiny_config(
        data,
        model={"n_layers": 2, "d_model": 96, "n_heads": 4, "context": 32},
        train={"micro_batch": 4, "global_batch": 4 * n},
        precision={"dtype": "bf16"},
    )


def wide(data: Path, dp: int, tp: int) -> dict[str, Any]:
    """2 blocks of width 1536 (57M parameters, fp32): 0.9 GB of states per rank at tp 1, 0.2 GB at tp 4."""
    par = {"tp": tp, "strategy": "single"} if tp > 1 else {"strategy": "ddp"}
    return tiny_config(
        data,
        model={"n_layers": 2, "d_model": 1536, "n_heads": 8, "context": 32},
        train={"micro_batch": 4, "global_batch": 4 * dp},
        precision={"dtype": "fp32"},
        parallel=par,
    )


def launch(tmp: Path, n: int, cfg: dict[str, Any], layouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = tmp / f"spec{n}.json"
    spec.write_text(
        json.dumps(
            {"config": cfg, "strategies": STRATEGIES, "steps": 2, "timed_steps": 1, "out": str(tmp), "layouts": layouts}
        )
    )
    # the workers `disttrain estimate --measure` starts, all strategies in one launch
    code, tail = run_module_captured(
        "disttrain.jobs.measure", [str(spec)], n, "cpu", env={"OMP_NUM_THREADS": "1"}, timeout=360, tail_lines=40
    )
    assert code == 0, tail
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> dict[int, list[dict[str, Any]]]:
    """Per world size, each rank's figures: the small model under every strategy, then the wide one (2 ranks:
    DDP, which holds what tp 1 holds, and tp 2; 4 ranks: tp 4), its bytes only (no timed steps)."""
    tmp = tmp_path_factory.mktemp("measure")
    bytes_only = {"steps": 1, "timed_steps": 0}  # the first step allocates the optimizer state: it holds the peak
    layouts = {
        2: [
            {"name": "tp1", "config": wide(small_text, 2, 1), "strategy": "ddp", **bytes_only},
            {"name": "tp2", "config": wide(small_text, 1, 2), "strategy": "single", **bytes_only},
        ],
        4: [{"name": "tp4", "config": wide(small_text, 1, 4), "strategy": "single", **bytes_only}],
    }
    return {n: launch(tmp, n, small(small_text, n), layouts[n]) for n in (2, 4)}


@pytest.mark.parametrize("n", [2, 4])
def test_measured_bytes_match_the_plan(measured: dict[int, list[dict[str, Any]]], small_text: Path, n: int) -> None:
    raw = small(small_text, n)
    est = plan_job(from_dict(raw), Layout(n, 1, 64 * GiB), cross_entropy)
    ranks = measured[n]
    for s in STRATEGIES:
        plan = est.plans[s]
        worst = max((r[s] for r in ranks), key=lambda m: m["params"])
        for row in EXACT_ROWS:
            pred, meas = plan.row(row), worst[row]
            assert abs(pred - meas) <= 0.05 * meas, f"{s} {row}: predicted {pred}, measured {meas}"
        # saved activations: the plan assumes everything in the compute dtype; allow the mixed-precision spread
        pred_act = est.profile.activations("none") - est.profile.backward_transient
        assert 0.6 * worst["activations_saved"] <= pred_act <= 1.6 * worst["activations_saved"], (s, worst)
        assert worst["peak"] > 0
        # step time, and the communication torch.profiler saw in one more step (gloo ranges, c10d ops)
        assert worst["comm_s"] > 0 and worst["step_s"] > 0, (s, worst)
    ddp = max(r["ddp"]["params"] + r["ddp"]["grads"] + r["ddp"]["optimizer"] for r in ranks)
    for s in ("fsdp", "fsdp_no_reshard"):
        fsdp = max(r[s]["params"] + r[s]["grads"] + r[s]["optimizer"] for r in ranks)
        padding = 3 * 4 * 4 * sum(p.shape[-1] if len(p.shape) > 1 else 1 for p in est.profile.params)
        assert fsdp <= ddp / n + padding, (s, fsdp, ddp / n)


def test_tensor_parallel_memory_per_rank_matches_the_plan_at_tp_1_2_4(
    measured: dict[int, list[dict[str, Any]]], small_text: Path
) -> None:
    """Per tp, the rank holding the most: its states exactly as planned (1/tp of tp 1's, up to uneven splits),
    the activations autograd saves within the spread above, and the total peak within TP_PEAK_ERROR."""
    peaks = {}
    for tp, n, dp in ((1, 2, 2), (2, 2, 1), (4, 4, 1)):
        est = plan_job(from_dict(wide(small_text, dp, tp)), Layout(n, 1, 64 * GiB, tp=tp), cross_entropy)
        plan, local = est.plans["ddp"], est.rank_profile
        worst = max((r[f"tp{tp}"] for r in measured[n]), key=lambda m: m["peak"])
        for row in EXACT_ROWS:
            pred, meas = plan.row(row), worst[row]
            assert abs(pred - meas) <= 0.05 * meas, f"tp {tp} {row}: predicted {pred}, measured {meas}"
        pred_act = local.activations("none") - local.backward_transient
        assert 0.6 * worst["activations_saved"] <= pred_act <= 1.6 * worst["activations_saved"], (tp, worst)
        assert abs(plan.total - worst["peak"]) <= TP_PEAK_ERROR * worst["peak"], (tp, plan.total, worst["peak"])
        peaks[tp] = worst["peak"]
    print({tp: f"{p / 2**20:.0f} MiB" for tp, p in peaks.items()})
    # what TP is for: a rank holds ~1/tp (less than half at tp 2: TP's DTensors step by foreach, with temporaries)
    assert peaks[1] > 1.4 * peaks[2] > 1.4**2 * peaks[4], peaks
