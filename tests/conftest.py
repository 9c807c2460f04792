"""Shared fixtures and what only the tests need: a small corpus, the CLI with the tests' folder on PYTHONPATH,
multi-process scenarios (tests/scenarios.py), a machine cache per test. What tests and benchmarks share
(launching, tiny jobs, faults, ports) lives in :mod:`disttrain.testing`."""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from disttrain.testing import launch
from disttrain.testing.tiny import build_tiny_trainer, write_small_text

if TYPE_CHECKING:
    from disttrain.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def child_env() -> dict[str, str]:
    """A child's environment, with this folder on PYTHONPATH (usermodel, hf_models: models by import path)."""
    return launch.child_env(TESTS)


@functools.cache
def doc_outputs() -> Any:
    """scripts/refresh_doc_outputs.py as a module: the docs' sample outputs and how one is checked."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("refresh_doc_outputs", ROOT / "scripts" / "refresh_doc_outputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def is_quick_start(sample: Any) -> bool:
    """The README's ``make run`` sample output (tests/cli/test_jobs.py checks it against the ``make run`` it runs)."""
    return bool(sample.page.name == "README.md" and sample.command[0] == "run")


def metric_steps(run: Path) -> list[int]:
    """The steps of a run folder's metrics.jsonl records, in file order ([] before the first one)."""
    metrics = run / "metrics.jsonl"
    return [json.loads(x)["step"] for x in metrics.read_text().splitlines()] if metrics.is_file() else []


def losses_by_step(run: Path) -> dict[int, float]:
    """The last loss logged for each step of a run folder (a restarted job logs the replayed steps again)."""
    out: dict[int, float] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def assert_one_line(proc: subprocess.CompletedProcess[str], *parts: str) -> None:
    """A mistake caught before any work: exit 2 and one line on stderr holding every one of ``parts``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    for part in parts:
        assert part in lines[0], (part, lines[0])


def bytes_job(data: Path, root: Path, name: str, *extra: str) -> list[str]:
    """12 steps of a tiny GPT (context 32) on ``data`` read as bytes, in fp32, batch 24 (2 ranks: 3 micro-batches
    of 4), a checkpoint every 4, in ``root/name``."""
    args = ["run", "--data.path", str(data), "--data.tokenizer", "bytes", "--model.n-layers", "2"]
    args += ["--model.d-model", "64", "--model.n-heads", "4", "--model.context", "32", "--train.steps", "12"]
    args += ["--train.global-batch", "24", "--train.micro-batch", "4", "--train.eval-interval", "0"]
    args += ["--train.generate-chars", "0", "--metrics.log-interval", "1", "--precision.dtype", "fp32"]
    args += ["--parallel.nproc", "2", "--checkpoint.interval", "4", "--run.root", str(root), "--run.name", name]
    return [*args, *extra]


def assert_resumes_exactly(data: Path, tmp_path: Path, want: dict[int, float]) -> None:
    """:func:`bytes_job` on ``data`` (a reference run ``ref`` already in ``tmp_path``, its losses ``want``): rank 1
    killed as step 11 starts resumes bitwise; 3 ranks from step 8 continue the global position (the same global
    batches, summed over 3 ranks instead of 2)."""

    def job(root: Path, name: str, *extra: str) -> list[str]:
        return bytes_job(data, root, name, *extra)

    import re

    crash = disttrain(
        *job(tmp_path, "crash", "--launch.max-restarts", "1"), cwd=tmp_path, env={"DISTTRAIN_FAULT": "step:11:1"}
    )
    assert crash.returncode == 0, crash.stderr[-3000:]
    assert re.search(r"resumed from \S+step-0000000[48] \(step [48], sample (96|192)\)", crash.stdout), crash.stdout
    assert losses_by_step(tmp_path / "crash") == want  # bitwise: the same windows in the same order
    step8 = tmp_path / "ref" / "checkpoints" / "step-00000008"
    three = ["--parallel.nproc", "3", "--parallel.oversubscribe", "--checkpoint.resume", str(step8)]
    grown = disttrain(*job(tmp_path, "three", *three), cwd=tmp_path)
    assert grown.returncode == 0, grown.stderr[-3000:]
    assert "(step 8, sample 192)" in grown.stdout, grown.stdout
    got = losses_by_step(tmp_path / "three")
    assert sorted(got) == [9, 10, 11, 12]
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-5), step


def pytest_sessionstart(session: pytest.Session) -> None:
    """This machine's figures are measured here, once, before any test (and before pytest-xdist starts its
    workers): in no test's time, outside every timeout (a first test under load once spent its 30 s measuring
    the machine, and its failure was every test's on that worker). The workers only read them."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        measured_machine(_shared_tmp(session.config._tmp_path_factory))  # type: ignore[attr-defined]


def _shared_tmp(factory: pytest.TempPathFactory) -> Path:
    """The folder every pytest-xdist worker of this session shares (its own basetemp's parent), or the
    session's basetemp in a serial run."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _machine_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test reads or writes the real ~/.cache/disttrain/machine.json (`disttrain doctor`, `estimate`). What
    module and session fixtures run sees this machine's measured figures too (as after the first plan here), so
    their commands do not measure it first whatever order the tests run in."""
    root, old = tmp_path_factory.mktemp("machine-cache"), os.environ.get("DISTTRAIN_CACHE_DIR")
    measured = measured_machine(_shared_tmp(tmp_path_factory))
    if measured:
        (root / "machine.json").write_text(measured)
    os.environ["DISTTRAIN_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("DISTTRAIN_CACHE_DIR", None)
    else:
        os.environ["DISTTRAIN_CACHE_DIR"] = old


@functools.cache
def measured_machine(shared: Path) -> str:
    """This machine's figures, measured once per session (what a plan measures on a machine with none,
    :func:`disttrain.jobs.doctor.measure_machine`) by the first process to get here (:func:`pytest_sessionstart`),
    the others reading them (every worker plans with the same figures): machine.json's text, or '' when the
    measurement failed."""
    seed = shared / "measured-machine"
    with open(shared / "measured-machine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = seed / "machine.json"
        if not (seed / "tried").exists():
            env = {**child_env(), "DISTTRAIN_CACHE_DIR": str(seed)}
            code = "from disttrain.jobs.doctor import measure_machine; print(measure_machine(2))"
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            seed.mkdir(exist_ok=True)
            (seed / "tried").touch()
        return cache.read_text() if cache.is_file() else ""


@pytest.fixture(autouse=True)
def _own_machine_cache(
    _machine_cache_root: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test starts from its own cache, holding this machine's measured figures (as after the first plan
    here): one test's `disttrain doctor` or `estimate --measure` never changes another's plan. A test that
    needs an empty cache empties it."""
    own = _machine_cache_root / str(next(_CACHE_IDS))
    own.mkdir()
    measured = measured_machine(_shared_tmp(tmp_path_factory))
    if measured:
        (own / "machine.json").write_text(measured)
    monkeypatch.setenv("DISTTRAIN_CACHE_DIR", str(own))


_CACHE_IDS = itertools.count()


@pytest.fixture(scope="session")
def small_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 60k characters of the bundled corpus: enough for tiny models, quick to tokenise."""
    return write_small_text(tmp_path_factory.mktemp("data") / "small.txt")


def disttrain(
    *args: str, cwd: Path | None = None, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real `disttrain` command (``env`` adds variables, e.g. DISTTRAIN_FAULT)."""
    return launch.run_disttrain(*args, cwd=cwd, timeout=timeout, env={**child_env(), **(env or {})})


def run_scenario(
    tmp: Path, name: str, nproc: int, variants: list[dict[str, Any]], timeout: float = 240
) -> list[dict[str, Any]]:
    """Launch tests/scenarios.py on ``nproc`` ranks; return each rank's {variant: result}."""
    spec = tmp / f"{name}.spec.json"
    spec.write_text(json.dumps(variants))
    return launch.launch_and_collect(nproc, TESTS / "scenarios.py", [str(spec)], env=child_env(), timeout=timeout)


@pytest.fixture
def tiny_trainer(small_text: Path) -> Callable[..., Trainer]:
    """build_tiny_trainer on the small corpus: ``tiny_trainer(train={"steps": 5}, seed=3, ...)``."""
    return functools.partial(build_tiny_trainer, small_text)


# single-process vs distributed losses in fp32: the same sums in another order
FP32 = {"rtol": 1e-5, "atol": 1e-5}


def losses(r: dict[str, Any], variant: str) -> torch.Tensor:
    """One rank's losses of one scenario variant (see run_scenario), in float64."""
    return torch.tensor(r[variant]["losses"], dtype=torch.float64)
