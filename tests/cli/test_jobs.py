"""Whole jobs through the real CLI, as a user runs them: the README's quick start, the Python API guide's examples,
TOML + overrides,
FSDP with a user's model and data, and what lands in the run folder."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, child_env, disttrain, doc_outputs, is_quick_start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
README = (ROOT / "README.md").read_text()
PYTHON_API = (ROOT / "docs" / "python-api.md").read_text()


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def only_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_readme_quick_start_commands_exist_and_ci_calls_the_test_one() -> None:
    assert "make run" in README and "make test" in README
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    dry = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "pytest" in dry and "ruff check" in dry and "mypy" in dry


def test_readme_default_job_with_few_steps(tmp_path: Path) -> None:
    """`make run` = the default job (bundled GPT, Shakespeare, 2 CPU ranks), shortened here (its steps take ~2 s)."""
    args = "--train.steps 4 --train.eval-interval 2 --train.eval-batches 2 --train.generate-chars 40"
    args += f" --run.root {tmp_path}"
    proc = subprocess.run(
        ["make", "-s", "run", f"ARGS={args}"], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = only_run(tmp_path)
    assert "strategy ddp x 2 rank(s) on cpu" in proc.stdout
    assert f"run folder: {run}" in proc.stdout and "--- sample ---" in proc.stdout
    assert (run / "logs" / "rank0.log").is_file() and (run / "logs" / "rank1.log").is_file()
    assert 'strategy = "ddp"' in (run / "config.toml").read_text()
    recs = records(run)
    assert [r["step"] for r in recs if "loss" in r] == [4]
    assert [r["step"] for r in recs if "val_loss" in r] == [2, 4]
    last = recs[-1]
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "tokens_per_s_per_rank", "mfu", "step_time_s"):
        assert last[key] > 0, key
    assert len(last["peak_memory_bytes"]) == 2 and min(last["peak_memory_bytes"]) > 50e6
    summary = json.loads((run / "summary.json").read_text())
    assert summary["unigram_val_loss"] == pytest.approx(3.3, abs=0.2)
    assert summary["final_val_loss"] < 4.5
    assert len((run / "sample.txt").read_text()) == 40
    # the README's sample of `make run`'s output holds for this shortened one (same lines, numbers aside)
    refresh = doc_outputs()
    sample = next(s for s in refresh.every_sample() if is_quick_start(s))
    shown = proc.stdout.replace(str(tmp_path), "runs")  # make run's default run root
    assert refresh.stale_lines(sample.lines, shown) == [], (sample.id, shown[-2000:])


def test_fsdp_job_from_toml_with_user_model_and_override(tmp_path: Path, small_text: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\nmodule = "usermodel:build"\ncontext = 32  # the window length the text data is cut to\n'
        f'[data]\npath = "{small_text}"\n'
        "[train]\nsteps = 500\nglobal_batch = 8\nmicro_batch = 2\neval_interval = 0\ngenerate_chars = 0\n"
        '[parallel]\nstrategy = "ddp"\n[metrics]\nlog_interval = 2\npeak_tflops = 1.0\n'
    )
    proc = disttrain(
        "run",
        "--config",
        str(job),
        "--train.steps",
        "4",
        "--parallel.strategy",
        "fsdp",
        "--parallel.forward-prefetch",
        "1",
        "--run.root",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = only_run(tmp_path / "runs")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == "fsdp" and summary["steps"] == 4 and summary["world_size"] == 2
    assert [r["step"] for r in records(run) if "loss" in r] == [2, 4]
    # gradient accumulation: 8 = 2 x accum x 2 ranks
    assert "accum 2" in proc.stdout


def test_user_dataset_by_import_path(tmp_path: Path) -> None:
    proc = disttrain(
        "run",
        "--model.module",
        "usermodel:build",
        "--data.module",
        "usermodel:dataset",
        "--train.steps",
        "100",
        "--train.global-batch",
        "8",
        "--train.micro-batch",
        "4",
        "--optim.warmup-steps",
        "3",
        "--optim.lr",
        "1e-2",
        "--train.eval-interval",
        "0",
        "--metrics.peak-tflops",
        "1",
        "--run.root",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["final_val_loss"] < 1.0  # the alphabet is easy to learn: proof the data reached the model


@pytest.mark.parametrize("name", ["own_loop", "trainer_api"])
def test_the_python_api_guides_examples_run(tmp_path: Path, name: str) -> None:
    source = (ROOT / "examples" / f"{name}.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", PYTHON_API, flags=re.S)
    assert source in blocks, f"docs/python-api.md must show examples/{name}.py verbatim"
    proc = disttrain("launch", "-n", "2", str(ROOT / "examples" / f"{name}.py"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if name == "own_loop":
        norms = [float(m) for m in re.findall(r"grad norm ([0-9.]+)", proc.stdout)]
        assert len(norms) == 5 and all(n > 0 for n in norms)
    else:
        m = re.search(r"loss ([0-9.]+) -> ([0-9.]+), validation ([0-9.]+)", proc.stdout)
        assert m, proc.stdout
        first, last, val = map(float, m.groups())
        assert last < first / 10 and val < first / 10
