"""Shared fixtures: a small corpus, the CLI, a runner for multi-process scenarios, and the tiny job in its
three forms (a config dict, `disttrain run` arguments, a single-process Trainer)."""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import torch

if TYPE_CHECKING:
    from disttrain.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
CORPUS = ROOT / "src" / "disttrain" / "data" / "shakespeare.txt.gz"
T = TypeVar("T")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    # this checkout's src first: the venv's editable install may point at another checkout (a git worktree)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join((str(ROOT / "src"), str(TESTS))))
    return env


def metric_steps(run: Path) -> list[int]:
    """The steps of a run folder's metrics.jsonl records, in file order ([] before the first one)."""
    metrics = run / "metrics.jsonl"
    return [json.loads(x)["step"] for x in metrics.read_text().splitlines()] if metrics.is_file() else []


def pids_mentioning(text: str | Path) -> list[int]:
    """Processes whose command line contains ``text`` (a run folder: its launchers and workers)."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and str(text).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.fixture(scope="session", autouse=True)
def _machine_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test reads or writes the real ~/.cache/disttrain/machine.json (`disttrain doctor`, `estimate`)."""
    root, old = tmp_path_factory.mktemp("machine-cache"), os.environ.get("DISTTRAIN_CACHE_DIR")
    os.environ["DISTTRAIN_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("DISTTRAIN_CACHE_DIR", None)
    else:
        os.environ["DISTTRAIN_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _own_machine_cache(_machine_cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an empty cache: one test's `disttrain doctor` never changes another's plan."""
    monkeypatch.setenv("DISTTRAIN_CACHE_DIR", str(_machine_cache_root / str(next(_CACHE_IDS))))


_CACHE_IDS = itertools.count()


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


def together(*launches: Callable[[], T], at_once: int | None = None) -> list[T]:
    """Independent launches (``lambda: disttrain(...)``, ``lambda: run_scenario(...)``) at the same time (``at_once``
    of them at most; default all), one thread each; their results in order (a failed assertion in one is raised
    here). Each launch leaves a core idle for much of its start-up (imports, the launcher's planning), so two
    overlap in about 80% of the time of one after the other. Only for jobs whose results do not depend on timing."""
    with ThreadPoolExecutor(at_once or len(launches)) as pool:
        futures = [pool.submit(launch) for launch in launches]
        return [f.result() for f in futures]


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


def tiny_cli_args(
    data: Path, steps: int, *extra: str, model: tuple[int, int, int] = (2, 64, 4), job: bool = True
) -> list[str]:
    """`disttrain run` arguments for a tiny GPT (``model`` = layers, width, heads; context 32) on ``data``.

    ``job`` adds the whole-job settings of tiny_config: batch 16 in micro-batches of 8, fp32, no evaluation
    and no sample, a metrics record every step. ``extra`` comes last (run folder, faults, overrides).
    """
    layers, width, heads = model
    args = [
        "run",
        "--data.path",
        str(data),
        "--model.n-layers",
        str(layers),
        "--model.d-model",
        str(width),
        "--model.n-heads",
        str(heads),
        "--model.context",
        "32",
        "--train.steps",
        str(steps),
    ]
    if job:
        args += [
            "--train.global-batch",
            "16",
            "--train.micro-batch",
            "8",
            "--train.eval-interval",
            "0",
            "--train.generate-chars",
            "0",
            "--precision.dtype",
            "fp32",
            "--metrics.log-interval",
            "1",
            "--metrics.peak-tflops",
            "1",
        ]
    return [*args, *extra]


def build_tiny_trainer(
    data: Path,
    *,
    seed: int | None = None,
    run_dir: Path | None = None,
    checkpoints: Path | None = None,
    **sections: dict[str, Any],
) -> Trainer:
    """A single-process fp32 Trainer on CPU for a 1-block GPT (width 32, 2 heads, context 32), batch 8.

    ``sections`` update the config's TOML sections; ``seed`` seeds both the data order and the model's
    initialisation (else the defaults of each); ``checkpoints`` is the folder of a CheckpointManager.
    """
    from disttrain.checkpoint import CheckpointManager
    from disttrain.config import from_dict
    from disttrain.data.text import load_text_data
    from disttrain.models.gpt import GPT, GPTConfig
    from disttrain.train.trainer import Trainer

    raw: dict[str, Any] = {
        "model": {"context": 32},
        "data": {"path": str(data)},
        "train": {"global_batch": 8, "micro_batch": 8, "eval_interval": 0},
        "parallel": {"strategy": "single", "device": "cpu"},
        "precision": {"dtype": "fp32"},
        "metrics": {"progress": "off", "peak_tflops": 1.0},
    }
    if seed is not None:
        raw["train"]["seed"] = seed
    for sec, body in sections.items():
        raw.setdefault(sec, {}).update(body)
    cfg = from_dict(raw)
    text = load_text_data(str(data), 32, 0.1)
    gpt = GPTConfig(text.tokenizer.vocab_size, n_layers=1, d_model=32, n_heads=2, context=32)
    model = GPT(gpt) if seed is None else GPT(gpt, seed=seed)
    ckpt = None if checkpoints is None else CheckpointManager(checkpoints, cfg.checkpoint)
    return Trainer(model, text.train, cfg, run_dir=run_dir, checkpoint=ckpt)


@pytest.fixture
def tiny_trainer(small_text: Path) -> Callable[..., Trainer]:
    """build_tiny_trainer on the small corpus: ``tiny_trainer(train={"steps": 5}, seed=3, ...)``."""
    return functools.partial(build_tiny_trainer, small_text)


# single-process vs distributed losses in fp32: the same sums in another order
FP32 = {"rtol": 1e-5, "atol": 1e-5}


def losses(r: dict[str, Any], variant: str) -> torch.Tensor:
    """One rank's losses of one scenario variant (see run_scenario), in float64."""
    return torch.tensor(r[variant]["losses"], dtype=torch.float64)
