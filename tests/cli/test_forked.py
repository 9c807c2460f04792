"""Ranks forked from the launcher (``disttrain.launch.forked``): when a rank is forked, that it starts and leaves
as a fresh ``python -u -m`` worker would, and that a job started the fresh way (``DISTTRAIN_WORKER_START=exec``,
torchrun's own) trains the same numbers."""

from __future__ import annotations

import gc
import json
import multiprocessing
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from disttrain.errors import ConfigError
from disttrain.launch.forked import START_ENV, forked_worker, source_defines_entry, start_method

from conftest import assert_one_line, bytes_job, disttrain, losses_by_step

pytestmark = pytest.mark.timeout(120)


def test_only_a_cpu_worker_module_with_an_entry_is_forked() -> None:
    assert start_method("forked_probe", "cpu", {}) == "fork"
    assert start_method("forked_probe", "cpu", {START_ENV: "exec"}) == "exec"
    assert start_method("forked_probe", "cuda", {}) == "exec"  # CUDA cannot fork once initialised
    assert start_method("json", "cpu", {}) == "exec"  # no entry(argv): a fresh interpreter runs it
    assert start_method("disttrain.jobs.run_worker", "cpu", {}) == "fork"
    with pytest.raises(ConfigError, match="DISTTRAIN_WORKER_START must be 'fork' or 'exec', got 'spawn'"):
        start_method("forked_probe", "cpu", {START_ENV: "spawn"})


def test_a_users_module_is_read_not_run_to_decide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "trains_on_import.py").write_text(
        f"open({str(marker)!r}, 'w').close()  # a script that trains at import\n\ndef entry(argv):\n    return 0\n"
    )
    (tmp_path / "no_entry.py").write_text("def main():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert start_method("trains_on_import", "cpu", {}) == "fork"
    assert start_method("no_entry", "cpu", {}) == "exec"
    assert start_method("not_a_module_anywhere", "cpu", {}) == "exec"
    assert not marker.exists()


class _Cycle:
    """Garbage in a reference cycle whose finalizer runs Python code: a collection inside the parser's tree
    building lets another thread in there."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(50))


def test_threads_deciding_at_once_all_read_the_entry() -> None:
    # the suite launches scenarios from threads; CPython 3.11's parser is not safe to enter from two at once
    scenarios = Path(__file__).parents[1] / "scenarios.py"
    switch, threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(10)

    def decide(_: int) -> list[bool]:
        found = []
        for _ in range(30):
            garbage = [_Cycle() for _ in range(100)]
            del garbage
            found.append(source_defines_entry(scenarios))
        return found

    try:
        with ThreadPoolExecutor(4) as pool:
            answers = [a for found in pool.map(decide, range(4)) for a in found]
    finally:
        sys.setswitchinterval(switch)
        gc.set_threshold(*threshold)
    assert answers == [True] * 120


def _fork(what: str, out: Path) -> multiprocessing.process.BaseProcess:
    proc = multiprocessing.get_context("fork").Process(target=forked_worker, args=("forked_probe", what, str(out)))
    proc.start()
    return proc


@pytest.mark.timing
def test_a_forked_rank_starts_and_leaves_as_a_fresh_one(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    old = signal.signal(signal.SIGTERM, lambda *_: None)  # the agent's handler: the rank must not keep it
    try:
        started = time.monotonic()
        procs = {what: _fork(what, tmp_path / f"{what}.json") for what in ("ok", "code", "raise", "exit0")}
        for proc in procs.values():
            proc.join(60)
    finally:
        signal.signal(signal.SIGTERM, old)
    # exit code 0 without waiting for the entry's non-daemon thread (120 s), its own code, 1 for an exception
    # exit_now(0) deep inside: 0 too (the agent hears of a success only from a return)
    assert {w: p.exitcode for w, p in procs.items()} == {"ok": 0, "code": 3, "raise": 1, "exit0": 0}
    assert time.monotonic() - started < 60
    err = capfd.readouterr()
    assert "probe done" in err.out
    assert "ValueError: boom from the probe" in err.err and "Traceback" in err.err  # the interpreter's hook
    for what in procs:
        found = json.loads((tmp_path / f"{what}.json").read_text())
        assert found == {
            "argv": ["forked_probe", what, str(tmp_path / f"{what}.json")],
            "sigterm_default": True,
            "sigint_interrupts": True,
            "write_through": True,
        }


@pytest.mark.slow
def test_a_job_started_the_fresh_way_trains_the_same_numbers(small_text: Path, tmp_path: Path) -> None:
    steps = ["--train.steps", "4", "--checkpoint.interval", "0"]
    forked = disttrain(*bytes_job(small_text, tmp_path, "forked", *steps), cwd=tmp_path)
    fresh = disttrain(*bytes_job(small_text, tmp_path, "fresh", *steps), cwd=tmp_path, env={START_ENV: "exec"})
    for proc in (forked, fresh):
        assert proc.returncode == 0, proc.stderr[-3000:]
    got = losses_by_step(tmp_path / "forked")
    assert sorted(got) == [1, 2, 3, 4] and got == losses_by_step(tmp_path / "fresh")


def test_launch_of_a_module_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    proc = disttrain("launch", "-n", "2", "-m", "no_such_module_here", cwd=tmp_path)
    assert_one_line(proc, "module 'no_such_module_here' cannot be imported here; check its name and PYTHONPATH")
