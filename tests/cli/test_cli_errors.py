"""Bad input gets one clear line on stderr and exit code 2, before any worker starts; no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import disttrain

pytestmark = pytest.mark.timeout(120)


def assert_one_line_error(proc, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    line = lines[0]
    assert line.startswith("disttrain: error: ")
    for n in needles:
        assert n in line, line
    return line


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--train.stepz", "3"], ["unknown option --train.stepz", "did you mean --train.steps"]),
        (["--trian.steps", "3"], ["unknown option", "--train.steps"]),
        (["--train.global-batch", "30", "--train.micro-batch", "8"], ["multiple of", "(30)", "try"]),
        (["--parallel.nproc", "512"], ["parallel.nproc (512)", "larger than"]),
        (["--model.module", "no_such_pkg.models:build"], ["cannot import module 'no_such_pkg.models'"]),
        (["--model.module", "json:no_such_fn"], ["has no callable 'no_such_fn'"]),
        (["--parallel.strategy", "fsdpp"], ["fsdpp"]),
        (["--train.steps", "0"], ["train.steps must be >= 1, got 0"]),
        (["--model.n-heads", "5"], ["model.n_heads (5) must divide model.d_model (384)", "try"]),
        (["--train.steps", "many"], ["many"]),
        (["--config", "/no/such.toml"], ["does not exist"]),
    ],
)
def test_bad_option_is_one_clear_line(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    assert_one_line_error(disttrain("run", *args, cwd=tmp_path), *needles)
    assert not (tmp_path / "runs").exists(), "no run folder may be made for a rejected config"


def test_unknown_toml_key_names_the_closest(tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text("[train]\nsteps = 5\nmicro_bach = 4\n")
    assert_one_line_error(disttrain("run", "--config", str(cfg), cwd=tmp_path), "train.micro_bach", "train.micro_batch")
    cfg.write_text("[trainn]\nsteps = 5\n")
    assert_one_line_error(disttrain("run", "--config", str(cfg), cwd=tmp_path), "[trainn]", "'train'")


def test_print_config_resolves_toml_then_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text('[train]\nsteps = 500\nmicro_batch = 4\n[parallel]\nstrategy = "auto"\n')
    proc = disttrain("run", "--config", str(cfg), "--train.steps", "7", "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "steps = 7\n" in out and "micro_batch = 4\n" in out
    assert 'strategy = "ddp"' in out and "nproc = 2" in out  # auto resolved on this 2-rank CPU default


def test_unknown_command_and_missing_script(tmp_path: Path) -> None:
    assert_one_line_error(disttrain("trian", cwd=tmp_path), "unknown command 'trian'")
    assert_one_line_error(disttrain("launch", "-n", "2", "nope.py", cwd=tmp_path), "script 'nope.py' does not exist")


def test_run_help_lists_every_option_and_the_config_flags(tmp_path: Path) -> None:
    proc = disttrain("run", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    flags = ("--config FILE", "--print-config", "--train.steps", "--parallel.forward-prefetch", "--precision.dtype")
    for flag in flags:
        assert flag in proc.stdout, flag
