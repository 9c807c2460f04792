"""What a new user meets in the first hour, each as the exact command that once failed (issue 27): their own
module from the current folder or a file path, and ``--parallel.strategy single`` on a machine of 2 devices."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from disttrain.testing.launch import DISTTRAIN

from conftest import TESTS, disttrain

pytestmark = pytest.mark.timeout(400)
SMALL = ["--train.global-batch", "8", "--train.micro-batch", "4", "--train.eval-interval", "0"]
SMALL += ["--metrics.peak-tflops", "1", "--train.generate-chars", "0"]


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A user's folder with their own module in it (not on PYTHONPATH, not installed)."""
    shutil.copy(TESTS / "usermodel.py", tmp_path / "mymod.py")
    return tmp_path


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(n in err for n in needles), err


@pytest.mark.slow
def test_a_module_in_the_current_folder_trains_on_two_ranks(here: Path) -> None:
    """`--model.module mymod:build` with mymod.py here failed in the parent: No module named 'mymod'."""
    args = ["run", "--model.module", "mymod:build", "--data.module", "mymod:dataset", "--train.steps", "2", *SMALL]
    proc = disttrain(*args, "--run.root", str(here / "runs"), cwd=here)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (here / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["world_size"] == 2
    # 2 steps under the default 30-step warmup: the LR never reaches optim.lr, and the run says so
    assert "warning: optim.warmup_steps (30) is longer than train.steps (2)" in proc.stdout, proc.stdout[-2000:]
    assert "stops at 7% of optim.lr" in proc.stdout and "--optim.warmup-steps 0" in proc.stdout
    log = (run / "logs" / "rank0.log").read_text()  # the step lines are in rank 0's log too, not only on screen
    assert "step      2/2 | loss" in log and "warning: optim.warmup_steps" in log, log[-2000:]


@pytest.mark.slow
def test_a_file_path_names_the_module_and_a_missing_one_is_one_line(here: Path) -> None:
    """`./mymod.py:build` printed a TypeError traceback; a file path is what torchrun users write."""
    (here / "models").mkdir()
    shutil.move(here / "mymod.py", here / "models" / "mine.py")
    args = ["run", "--model.module", "./models/mine.py:build", "--data.module", "models/mine.py:dataset", *SMALL]
    proc = disttrain(*args, "--train.steps", "2", "--parallel.nproc", "1", "--run.root", str(here / "runs"), cwd=here)
    assert proc.returncode == 0, proc.stderr[-3000:]
    missing = disttrain("run", "--model.module", "./nope.py:build", "--print-config", cwd=here)
    assert_one_line_error(missing, "model.module './nope.py:build'", "does not exist", str(here))
    no_fn = disttrain("run", "--model.module", "./models/mine.py:buidl", "--print-config", cwd=here)
    assert_one_line_error(no_fn, "has no callable 'buidl'")


@pytest.mark.slow
def test_single_means_one_process(tmp_path: Path) -> None:
    """`--parallel.strategy single` alone failed with 'world size is 2' on a machine with 2 devices."""
    proc = disttrain("run", "--parallel.strategy", "single", "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'strategy = "single"' in proc.stdout and "nproc = 1\n" in proc.stdout, proc.stdout
    two = disttrain("run", "--parallel.strategy", "single", "--parallel.nproc", "2", "--print-config", cwd=tmp_path)
    assert_one_line_error(two, "strategy 'single' runs one process", "--parallel.nproc 1")


def test_help_into_a_closed_pipe_is_no_traceback(tmp_path: Path) -> None:
    """`disttrain run --help | head` ended in a BrokenPipeError traceback."""
    proc = subprocess.Popen([str(DISTTRAIN), "run", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line: every write fails with EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_folder_as_data_path_is_named_a_folder(tmp_path: Path) -> None:
    """`--data.path corpus/` said the folder 'does not exist'."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("to be or not to be\n")
    proc = disttrain("run", "--data.path", str(tmp_path / "corpus"), "--print-config", cwd=tmp_path)
    assert_one_line_error(proc, "is a folder (it holds a.txt)", "pass one UTF-8 text file")


SMALL_VOCAB = """
import torch
from torch import nn

from disttrain.models.gpt import GPT, GPTConfig


def build():
    return GPT(GPTConfig(vocab_size=16, n_layers=1, d_model=32, n_heads=2, context=32))


def build_for_the_data(vocab_size):
    return GPT(GPTConfig(vocab_size=vocab_size, n_layers=1, d_model=32, n_heads=2, context=32))
"""


@pytest.mark.slow
def test_an_embedding_smaller_than_the_vocabulary_is_one_line_and_build_can_take_it(
    tmp_path: Path, small_text: Path
) -> None:
    """An embedding of 16 rows under data of more characters crashed every rank with a 40-line IndexError."""
    (tmp_path / "small.py").write_text(SMALL_VOCAB)
    data = ["--data.path", str(small_text), "--model.context", "32", "--parallel.strategy", "ddp"]
    small = disttrain("run", "--model.module", "small:build", *data, "--print-config", cwd=tmp_path)
    assert_one_line_error(small, "model.module 'small:build' embeds 16 token ids, but the data has", "at least")
    fits = ["run", "--model.module", "small:build_for_the_data", *data, *SMALL, "--train.steps", "2"]
    proc = disttrain(*fits, "--run.root", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_build_that_raises_is_named_with_its_own_frame(tmp_path: Path) -> None:
    """A build() that raised was blamed on the meta device with advice about .item()."""
    (tmp_path / "broken.py").write_text("def build():\n    sizes = {}\n    return sizes['d_model']\n")
    proc = disttrain(
        "run", "--model.module", "broken:build", "--parallel.strategy", "fsdp", "--print-config", cwd=tmp_path
    )
    assert_one_line_error(proc, "model.module 'broken:build' raised KeyError: 'd_model'", "broken.py:3 in build")
    assert "meta" not in proc.stderr


@pytest.mark.slow
def test_an_hf_export_that_cannot_name_its_config_says_so(tmp_path: Path, small_text: Path) -> None:
    """`ckpt export --format hf` without --config-from wrote a folder from_pretrained cannot load, silently."""
    seed = ["run", "--data.path", str(small_text), "--model.n-layers", "1", "--model.d-model", "32"]
    proc = disttrain(
        *seed, "--model.n-heads", "2", "--checkpoint.create-seed", "--run.root", str(tmp_path), "--run.name", "s"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    export = disttrain("ckpt", "export", str(tmp_path / "s"), "--format", "hf", cwd=tmp_path)
    assert_one_line_error(
        export, "--format hf needs the model's config.json", "it named no model.weights", "--config-from"
    )
    assert not (tmp_path / "s" / "hf").exists()  # nothing half-written
