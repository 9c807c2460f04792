"""HSDP (2 replicas x 2 shards), activation checkpointing and CPU offload on real gloo processes.

HSDP, AC and offload change where bytes live, never the numbers: each must reproduce the single-process
losses, and checkpoints must move between HSDP and FSDP (DCP reshards them).
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(500)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hsdp")

    def job(
        name: str, micro: int, ckpt: tuple[Path, str] | None = None, probe: bool = False, **parallel: Any
    ) -> dict[str, Any]:
        cfg = tiny_config(small_text, parallel=parallel, train={"micro_batch": micro})
        spec: dict[str, Any] = {"name": name, "config": cfg, "probe_applied": probe}  # see scenarios.probe_applied
        if ckpt is not None:  # (folder, "save" | a checkpoint path to resume from)
            folder, what = ckpt
            save = what == "save"
            cfg["train"]["steps"] = 6 if save else 8
            cfg["checkpoint"] = {
                "interval": 0,
                "resume": "never" if save else what,
                "save_final": "full" if save else "none",
            }
            spec.update(ckpt_folder=str(folder), probe="after_fit" if save else "after_resume")
        return spec

    fsdp_dir, hsdp_dir = tmp / "fsdp2", tmp / "hsdp4"
    two = [
        job("fsdp", 8, probe=True, strategy="fsdp"),
        job("fsdp_ac", 8, probe=True, strategy="fsdp", activation_checkpointing="full"),
        job("fsdp_offload", 8, probe=True, strategy="fsdp", offload=True),
        job("ddp_ac", 8, probe=True, strategy="ddp", activation_checkpointing="2"),
        job("save", 8, (fsdp_dir, "save"), strategy="fsdp"),
    ]
    single, pair = together(
        lambda: run_scenario(tmp, "single", 1, [job("fp32", 16, probe=True, strategy="single")]),
        lambda: run_scenario(tmp, "two", 2, two),
    )
    out = {"single": single, "two": pair}
    hsdp = {"strategy": "hsdp", "replicate": 2, "shard": 2}
    out["hsdp4"] = run_scenario(
        tmp,
        "hsdp4",
        4,
        [
            job("fp32", 4, **hsdp),
            job("save", 4, (hsdp_dir, "save"), **hsdp),
            job("load_fsdp", 4, (tmp / "a", str(fsdp_dir / "step-00000006")), **hsdp),
        ],
    )
    out["fsdp_from_hsdp"] = run_scenario(
        tmp, "fsdp_from_hsdp", 2, [job("load_hsdp", 8, (tmp / "b", str(hsdp_dir / "step-00000006")), strategy="fsdp")]
    )
    return out


def test_hsdp_losses_match_single_process(results: dict[str, Any]) -> None:
    ref = losses(results["single"][0], "fp32")
    assert ref[-1] < ref[0] - 0.5, "the reference must actually train"
    for rank_result in results["hsdp4"]:
        assert rank_result["fp32"]["strategy"] == "hsdp"
        assert_close(losses(rank_result, "fp32"), ref, **FP32)
        norms = torch.tensor(rank_result["fp32"]["grad_norms"])
        assert_close(norms, torch.tensor(results["single"][0]["fp32"]["grad_norms"]), rtol=1e-4, atol=1e-5)


# each variant's run without the setting (its probe ran the same forward on the same 8 windows), and which
# of the 2 blocks recompute: "full" = both, "2" = every other one
WITHOUT = {"fsdp_ac": ("two", "fsdp"), "fsdp_offload": ("two", "fsdp"), "ddp_ac": ("single", "fp32")}
CHECKPOINTED = {"fsdp_ac": [True, True], "fsdp_offload": [False, False], "ddp_ac": [True, False]}


def assert_checkpointing_applied(got: dict[str, Any], without: dict[str, Any], variant: str) -> None:
    """The chosen blocks carry torch's checkpoint hooks, and one forward keeps fewer tensors for backward."""
    assert got["checkpointed"] == CHECKPOINTED[variant]
    saved, plain = got["saved"], without["saved"]
    if variant == "fsdp_offload":  # offload moves shards, not activations
        assert saved == plain
        return
    share = 0.5 if variant == "fsdp_ac" else 0.8  # all blocks recompute, or one block of two
    assert saved["tensors"] < plain["tensors"] and saved["bytes"] < share * plain["bytes"], (saved, plain)


def assert_offload_applied(got: dict[str, Any], without: dict[str, Any], variant: str) -> None:
    """Every FSDP unit has the CPU offload policy (and only with offload), its shards, their gradients and the
    Adam state are in host memory, pinned where there is an accelerator to pin for."""
    policy = "CPUOffloadPolicy" if variant == "fsdp_offload" else "OffloadPolicy"
    assert got["policies"] == [policy] * 3, got  # 2 blocks + the root
    assert without["policies"] == ["OffloadPolicy"] * 3 and not any(without["to_cpu"])  # the probe tells apart
    assert set(got["to_cpu"]) == {variant == "fsdp_offload"}  # every sharded parameter, or none
    if variant == "fsdp_offload":
        pin = torch.cuda.is_available()
        assert set(got["pin_memory"]) == {pin} and set(got["pinned"]) == {pin}
    assert got["param_devices"] == got["grad_devices"] == got["optim_devices"] == ["cpu"]
    assert got["optim_tensors"] >= 3 * len(got["to_cpu"])  # step, exp_avg, exp_avg_sq per parameter


@pytest.mark.parametrize("variant", ["fsdp_ac", "fsdp_offload", "ddp_ac"])
def test_activation_checkpointing_and_offload_change_memory_not_numbers(results: dict[str, Any], variant: str) -> None:
    ref = losses(results["single"][0], "fp32")
    job, name = WITHOUT[variant]
    without = results[job][0][name]["applied"]
    assert without["checkpointed"] == [False, False]
    for rank_result in results["two"]:
        assert_close(losses(rank_result, variant), ref, **FP32)
        got = rank_result[variant]["applied"]
        assert_checkpointing_applied(got, without, variant)
        if variant != "ddp_ac":
            assert_offload_applied(got["offload"], without["offload"], variant)
    # recomputation in fp32 on CPU is deterministic: bitwise equal to the same strategy without it
    if variant != "ddp_ac":
        assert_close(losses(results["two"][0], variant), losses(results["two"][0], "fsdp"), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("target", "variant", "source"), [("hsdp4", "load_fsdp", "two"), ("fsdp_from_hsdp", "load_hsdp", "hsdp4")]
)
def test_checkpoints_move_between_hsdp_and_fsdp(
    results: dict[str, Any], target: str, variant: str, source: str
) -> None:
    saved = results[source][0]["save"]["probe"]
    for rank_result in results[target]:
        got = rank_result[variant]["probe"]
        assert got["step"] == 6 and got["position"] == 6 * 16
        assert got["fixed_loss"] == pytest.approx(saved["fixed_loss"], rel=1e-6, abs=1e-7)
        assert got["optim"].keys() == saved["optim"].keys() and len(saved["optim"]) > 10
        for k, v in saved["optim"].items():
            assert got["optim"][k] == pytest.approx(v, rel=1e-5, abs=1e-8), k
