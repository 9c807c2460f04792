"""The hook points engines fire (disttrain.utils.hooks), the fault plugin that DISTTRAIN_FAULT installs on them
(disttrain.testing.faults), and the small shared helpers (ports, the CPU's name, launch environments). The
faults themselves act in whole jobs: tests/checkpoint, tests/health, tests/ps, tests/rl."""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from disttrain.errors import ConfigError
from disttrain.testing import faults
from disttrain.testing.launch import child_env, import_root
from disttrain.testing.ports import free_port
from disttrain.utils import hooks
from disttrain.utils.host import cpu_name

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _no_plugin_left(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("DISTTRAIN_FAULT", raising=False)
    yield
    faults.uninstall()


def test_hooks_run_in_order_pass_values_through_and_come_off() -> None:
    seen: list[tuple[str, int, int]] = []
    off_a = hooks.on("step_start", lambda step, rank: seen.append(("a", step, rank)))
    off_b = hooks.on("step_start", lambda step, rank: seen.append(("b", step, rank)))
    hooks.fire("step_start", 3, 1)
    hooks.fire("save_start", 3, 1)  # nothing registered there
    assert seen == [("a", 3, 1), ("b", 3, 1)]
    off_a()
    hooks.fire("step_start", 4, 0)
    assert seen[-1] == ("b", 4, 0) and len(seen) == 3
    off_b()
    off_b()  # twice is harmless
    hooks.fire("step_start", 5, 0)
    assert len(seen) == 3
    assert hooks.apply("loss", 2.0, 1, 0) == 2.0  # no hook: the value as it is
    off_double = hooks.on_value("loss", lambda v, step, rank: v * 2)
    off_plus = hooks.on_value("loss", lambda v, step, rank: v + step)
    assert hooks.apply("loss", 2.0, 1, 0) == 5.0  # (2 * 2) + 1: in registration order
    off_double()
    off_plus()
    assert hooks.apply("loss", 2.0, 1, 0) == 2.0


def test_install_parses_the_spec_and_a_bad_entry_is_one_clear_error() -> None:
    assert faults.parse(" step:11:1,,nan:2:0 ") == [faults.Fault("step", 11, 1), faults.Fault("nan", 2, 0)]
    for bad in ("step:11", "stpe:11:1", "step:x:1", "step:1:2:3", "hang:-1:0"):
        with pytest.raises(ConfigError, match=r"DISTTRAIN_FAULT entry .* is not <kind>:<step>:<rank>") as e:
            faults.install(bad)
        assert "kinds: step, before_shards" in str(e.value) and bad.split(",")[0] in str(e.value)


def test_installed_faults_act_at_their_point_only_and_io_errors_on_every_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTTRAIN_FAULT", "read_error:12:1,write_error:8:0,nan:2:0,step:3:0")
    injector = faults.install()  # from the variable, as a worker entry does
    assert hooks.plugins() == (faults.PLUGIN,)
    hooks.fire("load_start", 12, 0)  # another rank
    hooks.fire("load_start", 11, 1)  # another step
    with pytest.raises(OSError, match=r"injected I/O error \(DISTTRAIN_FAULT=read_error:12:1\)") as e:
        hooks.fire("load_start", 12, 1)
    assert e.value.errno == errno.EIO
    nan = hooks.apply("loss", 1.0, 2, 0)
    assert nan != nan and hooks.apply("loss", 1.0, 2, 0) == 1.0  # a NaN once per process
    assert injector.named("step", 3, 0) and not injector.named("step", 4, 0)
    # a restarted job (torchrun's second attempt) runs through, but a failing disk still fails
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = faults.install()
    assert [str(f) for f in again.faults] == ["read_error:12:1", "write_error:8:0"]
    assert hooks.apply("loss", 1.0, 2, 0) == 1.0
    with pytest.raises(OSError):
        hooks.fire("shards_write", 8, 0)
    faults.uninstall()
    hooks.fire("shards_write", 8, 0)  # nothing left on the points
    assert hooks.plugins() == ()


def test_when_a_fault_acts_first_attempt_every_attempt_or_once_per_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``:once`` fires on whichever attempt first reaches it (its mark in DISTTRAIN_FAULT_STATE stops every
    other process and attempt), ``:every`` on each attempt, no suffix on the first attempt only."""
    monkeypatch.delenv("DISTTRAIN_FAULT_STATE", raising=False)
    spec = "nan:5:0:once,nan:9:1:every,nan:3:0,step:4:1:once"
    assert [str(f) for f in faults.parse(spec)] == spec.split(",")
    assert [f.policy for f in faults.parse(spec + ",write_error:2:0")] == ["once", "every", "first", "once", "every"]
    with pytest.raises(ConfigError, match=r"nan:5:0:once, step:4:1:once act once per job: set DISTTRAIN_FAULT_STATE"):
        faults.install(spec)
    with pytest.raises(ConfigError, match=r"<when> first, every, once"):
        faults.install("nan:5:0:sometimes")
    monkeypatch.setenv("DISTTRAIN_FAULT_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("DISTTRAIN_FAULT", spec)

    def is_nan(step: int, rank: int) -> bool:
        value = hooks.apply("loss", 1.0, step, rank)
        return bool(value != value)

    faults.install()  # attempt 0 dies before step 5 (say): its nan:3:0 and nan:9:1 act, the once faults wait
    assert is_nan(3, 0) and is_nan(9, 1) and not (tmp_path / "state" / "nan-5-0").exists()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = faults.install()
    assert [str(f) for f in again.faults] == ["nan:5:0:once", "nan:9:1:every", "step:4:1:once"]
    assert not is_nan(3, 0) and is_nan(9, 1)  # first-attempt only; every attempt
    assert is_nan(5, 0) and not is_nan(5, 0)  # fires here, once
    mark = json.loads((tmp_path / "state" / "nan-5-0").read_text())
    assert mark["fault"] == "nan:5:0:once" and mark["attempt"] == 1 and mark["pid"] == os.getpid()
    assert again.take("step", 4, 1) == faults.Fault("step", 4, 1, "once")  # claimed: a real hook kills here
    assert again.take("step", 4, 1) is not None  # the claiming process still acts (slow: from its step on)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    third = faults.install()
    assert not is_nan(5, 0) and is_nan(9, 1)  # fired in attempt 1
    assert third.named("step", 4, 1) and third.take("step", 4, 1) is None


def test_a_plugin_is_loaded_once_by_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """What DCP's save process does with the plugins its writer carries (hooks.load_plugins)."""
    monkeypatch.setenv("DISTTRAIN_FAULT", "write_error:4:1")
    hooks.load_plugins([faults.PLUGIN])
    hooks.load_plugins([faults.PLUGIN])
    with pytest.raises(OSError, match="write_error:4:1"):
        hooks.fire("shards_write", 4, 1)
    assert hooks.plugins() == (faults.PLUGIN,)


def test_free_port_cpu_name_and_child_environments(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nobody holds it
    assert cpu_name() and "\n" not in cpu_name()
    env = child_env("/a", base={"PYTHONPATH": "/b", "X": "1"}, extra={"Y": "2"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/a", "/b"]) and env["X"] == "1" and env["Y"] == "2"
    assert env["OMP_NUM_THREADS"] == "1" and "PYTHONPATH" not in child_env(base={})
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").touch()
    (tmp_path / "pkg" / "sub" / "__init__.py").touch()
    assert import_root(tmp_path / "pkg" / "sub" / "run.py") == tmp_path
    assert import_root(tmp_path / "run.py") is None
