"""Distributed training equals single-process training: DDP and FSDP2 on real gloo processes.

Each scenario runs several variants inside one process group (see scenarios.py); the single-process
reference runs the same variants on one rank with the same global batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from disttrain.testing.launch import together
from disttrain.testing.tiny import tiny_config

from conftest import FP32, losses, run_scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def variants(data: Path, strategy: str, extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    par = {"strategy": strategy}
    out = [
        {"name": "fp32", "config": tiny_config(data, parallel=par)},
        {"name": "bf16", "config": tiny_config(data, parallel=par, precision={"dtype": "bf16"})},
        # 4 micro-steps of 2 samples per rank at 2 ranks == one step of 16 in one process
        {
            "name": "accum",
            "config": tiny_config(data, parallel=par, train={"micro_batch": 16 if strategy == "single" else 2}),
        },
    ]
    return out + (extra or [])


def fsdp_variants(small_text: Path) -> list[dict[str, Any]]:
    """FSDP-only settings that must change the schedule, never the numbers."""
    par_fsdp = {"strategy": "fsdp"}
    sync = {"check": "sync"}
    return [
        {
            "name": "prefetch",
            "config": tiny_config(small_text, parallel={**par_fsdp, "forward_prefetch": 2, "backward_prefetch": 2}),
        },
        {
            "name": "implicit",  # FSDP's own one-ahead order, no explicit prefetch
            "config": tiny_config(small_text, parallel={**par_fsdp, "forward_prefetch": 0, "backward_prefetch": 0}),
        },
        {  # both blocks in one FSDP unit: one all-gather and one reduce-scatter for the pair
            "name": "grouped",
            "config": tiny_config(small_text, parallel={**par_fsdp, "blocks_per_unit": 2}),
        },
        {  # the embeddings and the final norm + head in units of their own (torchtitan's layout)
            "name": "split_root",
            "config": tiny_config(small_text, parallel={**par_fsdp, "root_units": "split"}),
        },
        {
            "name": "no_reshard",
            "config": tiny_config(small_text, parallel={**par_fsdp, "reshard_after_forward": "never"}),
        },
        {"name": "sync", **sync, "config": tiny_config(small_text, parallel=par_fsdp, train={"micro_batch": 2})},
        # compiled blocks, each inside its activation checkpoint, sharded by fully_shard (see test_compile.py)
        {
            "name": "compile",
            "config": tiny_config(
                small_text, parallel={**par_fsdp, "compile": "blocks", "activation_checkpointing": "full"}
            ),
        },
    ]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("parity")
    par_fsdp = {"strategy": "fsdp"}
    sync = {"check": "sync"}
    fsdp_extra = fsdp_variants(small_text)

    def guards(strategy: str) -> list[dict[str, Any]]:
        par = {"strategy": strategy}
        return [
            {"name": "nan", "nan_at": {"rank": 1, "call": 4}, "config": tiny_config(small_text, parallel=par)},
            {"name": "fp16", "config": tiny_config(small_text, parallel=par, precision={"dtype": "fp16"})},
        ]

    fsdp_extra += guards("fsdp")
    ddp_extra = [
        {
            "name": "sync",
            **sync,
            "config": tiny_config(small_text, parallel={"strategy": "ddp"}, train={"micro_batch": 2}),
        },
        *guards("ddp"),
    ]
    fsdp4 = [{"name": "fp32", "config": tiny_config(small_text, parallel=par_fsdp, train={"micro_batch": 4})}]
    # two launches at a time: each leaves the cores idle for part of its start (imports, rendezvous)
    single, ddp2, fsdp2, fsdp4_results = together(
        lambda: run_scenario(tmp, "single", 1, variants(small_text, "single")),
        lambda: run_scenario(tmp, "ddp2", 2, variants(small_text, "ddp", ddp_extra)),
        lambda: run_scenario(tmp, "fsdp2", 2, variants(small_text, "fsdp", fsdp_extra)),
        lambda: run_scenario(tmp, "fsdp4", 4, fsdp4),
        at_once=2,
    )
    return {"single": single, "ddp2": ddp2, "fsdp2": fsdp2, "fsdp4": fsdp4_results}


@pytest.mark.parametrize("job", ["ddp2", "fsdp2", "fsdp4"])
def test_fp32_losses_match_single_process(results: dict[str, Any], job: str) -> None:
    ref = losses(results["single"][0], "fp32")
    assert len(ref) == 20 and ref[-1] < ref[0] - 0.5, "the reference must actually train"
    for rank_result in results[job]:
        assert rank_result["fp32"]["strategy"] == job[:-1]
        assert_close(losses(rank_result, "fp32"), ref, **FP32)


@pytest.mark.parametrize("job", ["ddp2", "fsdp2"])
def test_bf16_losses_match_single_process_loosely(results: dict[str, Any], job: str) -> None:
    ref = losses(results["single"][0], "bf16")
    got = losses(results[job][0], "bf16")
    assert_close(got, ref, rtol=2e-2, atol=2e-2)
    # and bf16 really is a different computation from fp32 (the test would catch a silently-ignored dtype)
    assert not torch.equal(got, losses(results[job][0], "fp32"))


@pytest.mark.parametrize("job", ["ddp2", "fsdp2"])
def test_accumulation_equals_one_full_batch_step(results: dict[str, Any], job: str) -> None:
    assert results[job][0]["accum"]["accum"] == 4
    assert results["single"][0]["accum"]["accum"] == 1
    assert_close(losses(results[job][0], "accum"), losses(results["single"][0], "accum"), **FP32)


def test_ddp_grads_are_not_synced_before_the_last_micro_step(results: dict[str, Any]) -> None:
    steps = results["ddp2"][0]["sync"]["micro_steps"]
    assert [s["ranks_agree"] for s in steps] == [False, False, False, True]


def test_fsdp_grads_are_not_reduced_before_the_last_micro_step(results: dict[str, Any]) -> None:
    steps = results["fsdp2"][0]["sync"]["micro_steps"]
    assert [s["grad_present"] for s in steps] == [False, False, False, True]


def test_compiled_checkpointed_blocks_under_fsdp_match_single_process(results: dict[str, Any]) -> None:
    ref = losses(results["single"][0], "fp32")
    for rank_result in results["fsdp2"]:
        assert rank_result["compile"]["compiled_graphs"] >= 1, "the blocks must really have been compiled"
        assert_close(losses(rank_result, "compile"), ref, **FP32)


def test_prefetch_reshard_and_grouping_change_the_schedule_not_the_numbers(results: dict[str, Any]) -> None:
    r = results["fsdp2"][0]
    implicit = [b["fwd"] for b in r["implicit"]["schedule"]["blocks"]]
    assert implicit == [0, 0]
    for variant in ("fp32", "prefetch"):  # the default (auto, no plan in the Python API: one ahead) and 2 ahead
        blocks = r[variant]["schedule"]["blocks"]
        assert [b["fwd"] for b in blocks] == [1, 0] and [b["bwd"] for b in blocks] == [0, 1]
    assert [b["reshard"] for b in r["fp32"]["schedule"]["blocks"]] == [True, False]
    assert [b["reshard"] for b in r["no_reshard"]["schedule"]["blocks"]] == [False, False]
    # one unit of both blocks: nothing to prefetch, and it stays gathered for backward (the last unit)
    grouped = r["grouped"]["schedule"]["blocks"]
    assert [b["fwd"] for b in grouped] == [0, 0] and [b["reshard"] for b in grouped] == [False, False]
    # embeddings, 2 blocks, final norm + head: 4 units (the root holds no parameter of its own); the last block
    # is no longer the last unit, so it reshards too; the tiny model's default keeps them in the root (3 units)
    split = r["split_root"]["schedule"]
    assert (split["units"], r["fp32"]["schedule"]["units"]) == (4, 3)
    assert [b["reshard"] for b in split["blocks"]] == [True, True]
    for variant in ("prefetch", "implicit", "no_reshard", "grouped", "split_root"):
        assert_close(losses(r, variant), losses(r, "fp32"), rtol=0, atol=0)


@pytest.mark.parametrize("job", ["ddp2", "fsdp2", "fsdp4"])
def test_grad_norm_is_the_global_norm(results: dict[str, Any], job: str) -> None:
    ref = torch.tensor(results["single"][0]["fp32"]["grad_norms"])
    for rank_result in results[job]:
        assert_close(torch.tensor(rank_result["fp32"]["grad_norms"]), ref, rtol=1e-4, atol=1e-5)


def test_every_rank_reports_the_same_numbers(results: dict[str, Any]) -> None:
    for job in ("ddp2", "fsdp2", "fsdp4"):
        first = results[job][0]["fp32"]
        for other in results[job][1:]:
            assert other["fp32"]["losses"] == first["losses"]
            assert other["fp32"]["grad_norms"] == first["grad_norms"]


@pytest.mark.parametrize("job", ["ddp2", "fsdp2"])
def test_nan_on_one_rank_skips_the_step_on_every_rank(results: dict[str, Any], job: str) -> None:
    ref = losses(results[job][0], "fp32")
    for rank_result in results[job]:
        r = rank_result["nan"]
        assert r["skipped"] == 1
        got = losses(rank_result, "nan")
        assert torch.isnan(got[3]) and torch.isfinite(got[4:]).all()
        assert_close(got[:3], ref[:3], rtol=0, atol=0)  # identical until the poisoned step
        assert not torch.equal(got[4:], ref[4:])  # one update fewer: a different trajectory afterwards
    assert results[job][0]["nan"]["losses"][4:] == results[job][1]["nan"]["losses"][4:]


@pytest.mark.parametrize("job", ["ddp2", "fsdp2"])
def test_fp16_with_loss_scaling_trains(results: dict[str, Any], job: str) -> None:
    r = results[job][0]["fp16"]
    got = losses(results[job][0], "fp16")
    # the scaler starts at 2**16 and halves on overflow: those few steps (if any: it depends on the model's
    # initial gradients) are skipped and counted
    assert 0 <= r["skipped"] <= 4 and torch.isfinite(got).all()
    fp32 = losses(results[job][0], "fp32")
    assert got[-1] < got[0] - 0.5 and abs(float(got[-1] - fp32[-1])) < 0.15
    assert_close(got[:5], fp32[:5], rtol=1e-2, atol=1e-2)  # before any overflow: fp32 to fp16 precision
