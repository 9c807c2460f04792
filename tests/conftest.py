"""Shared fixtures: a small corpus, the CLI, and a runner for multi-process scenarios."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
CORPUS = ROOT / "src" / "disttrain" / "data" / "shakespeare.txt.gz"


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(TESTS))
    return env


@pytest.fixture(scope="session")
def small_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 60k characters of the bundled corpus: enough for tiny models, quick to tokenise."""
    path = tmp_path_factory.mktemp("data") / "small.txt"
    path.write_text(gzip.decompress(CORPUS.read_bytes()).decode()[:60_000])
    return path


def disttrain(
    *args: str, cwd: Path | None = None, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real `disttrain` command (``env`` adds variables, e.g. DISTTRAIN_FAULT)."""
    return subprocess.run(
        [str(BIN / "disttrain"), *args],
        cwd=cwd,
        env={**child_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_scenario(
    tmp: Path, name: str, nproc: int, variants: list[dict[str, Any]], timeout: float = 240
) -> list[dict[str, Any]]:
    """Launch tests/scenarios.py on ``nproc`` ranks; return each rank's {variant: result}."""
    spec = tmp / f"{name}.spec.json"
    spec.write_text(json.dumps(variants))
    proc = disttrain(
        "launch", "-n", str(nproc), str(TESTS / "scenarios.py"), name, str(tmp), str(spec), timeout=timeout
    )
    assert proc.returncode == 0, f"scenario {name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return [json.loads((tmp / f"{name}.rank{r}.json").read_text()) for r in range(nproc)]


def tiny_config(data_path: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A tiny GPT job in TOML layout (2 blocks, width 64, context 32), fp32, no eval noise."""
    cfg: dict[str, Any] = {
        "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "context": 32},
        "data": {"path": str(data_path)},
        "train": {
            "steps": 20,
            "global_batch": 16,
            "micro_batch": 8,
            "eval_interval": 0,
            "eval_batches": 2,
            "generate_chars": 0,
            "seed": 7,
        },
        "optim": {"lr": 3e-3, "warmup_steps": 5},
        "parallel": {"strategy": "auto", "device": "cpu", "timeout_s": 60},
        "precision": {"dtype": "fp32"},
        "metrics": {"progress": "off", "peak_tflops": 1.0},
    }
    for sec, body in sections.items():
        cfg.setdefault(sec, {}).update(body)
    return cfg
