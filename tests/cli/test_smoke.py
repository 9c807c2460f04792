"""The smoke matrix: every strategy x 1 and 2 processes x the built-in GPT and a Hugging Face model, a few
steps each through the real `disttrain run`. A change to one capability that breaks another fails here first
(`--parallel.strategy fsdp --parallel.nproc 1` once failed for every model with a field nobody set)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from conftest import disttrain, tiny_cli_args, together

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LAYOUTS = [("single", 1), ("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2), ("hsdp", 1), ("hsdp", 2)]
MODELS = {"builtin": [], "hf_gpt2": ["--model.module", "hf_models:gpt2"]}


@pytest.mark.parametrize("model", list(MODELS))
def test_every_strategy_on_one_and_two_processes_trains(tmp_path: Path, small_text: Path, model: str) -> None:
    if model != "builtin":
        pytest.importorskip("transformers", reason="transformers is a test dependency (make test installs it)")

    def run(strategy: str, nproc: int) -> tuple[str, int, subprocess.CompletedProcess[str]]:
        root = tmp_path / f"{strategy}{nproc}"
        args = ["--parallel.strategy", strategy, "--parallel.nproc", str(nproc), "--run.root", str(root)]
        proc = disttrain(*tiny_cli_args(small_text, 2, *MODELS[model], *args), timeout=300)
        return strategy, nproc, proc

    failed = []
    for strategy, nproc, proc in together(*(lambda s=s, n=n: run(s, n) for s, n in LAYOUTS), at_once=2):
        if proc.returncode != 0:
            failed.append(f"{strategy} x {nproc}: {proc.stderr[-1500:]}")
            continue
        (run_dir,) = [p for p in (tmp_path / f"{strategy}{nproc}").iterdir() if p.is_dir()]
        summary = json.loads((run_dir / "summary.json").read_text())
        resolved = json.loads((run_dir / "resolved.json").read_text())
        assert summary["strategy"] == strategy == resolved["strategy"], (summary, resolved["strategy"])
        assert summary["steps"] == 2 and summary["world_size"] == nproc
        assert math.isfinite(summary["final_loss"]), summary
    assert not failed, "\n\n".join(failed)
