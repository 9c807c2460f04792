"""Workers forked from the launcher instead of started afresh: on CPU, torchrun's agent (or the launcher of the
RPC jobs, :mod:`disttrain.launch.direct`) forks each rank from this process, which has already imported torch
and disttrain and planned the job, so a rank starts in milliseconds instead of spending seconds importing them
again (per rank, per attempt: 2 ranks share 2 cores).

Only for a worker module that defines ``entry(argv: list[str]) -> int`` (its exit code; ours: ``run_worker``,
``ps_worker``, ``rl_worker``, ``doctor_worker``), on CPU: a CUDA process cannot fork once CUDA is initialised,
and a user's script (``disttrain launch script.py``) gets a fresh interpreter as torchrun gives it; a module
(``disttrain launch -m pkg.mod``) whose source defines ``entry`` is forked too.
``DISTTRAIN_WORKER_START=exec`` starts every worker as a fresh ``python -m`` process (torchrun's way) instead.

What a fresh interpreter would have had, a forked rank is given here: default signal handlers (not the
agent's), unbuffered standard streams (``python -u``), glibc's heap settings of
:data:`disttrain.utils.malloc.CPU_MALLOC_ENV` (read by glibc only at process start, so applied by ``mallopt``),
and an uncaught exception printed by the interpreter's hook before exit code 1.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from disttrain.utils.malloc import CPU_MALLOC_ENV, keep_large_buffers
from disttrain.utils.process import exit_now, success_returns

START_ENV = "DISTTRAIN_WORKER_START"
"""``fork`` (the default on CPU) or ``exec`` (a fresh ``python -m`` per rank, as torchrun starts one)."""

_PARSE_LOCK = threading.Lock()
"""CPython 3.11's parser keeps its recursion depth in interpreter-wide state: two threads parsing at once (the
test suite's :func:`disttrain.testing.launch.together`) can fail with 'AST constructor recursion depth mismatch'."""

_RESET_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)


def start_method(module: str, device_type: str, env: Mapping[str, str]) -> str:
    """``fork`` where a rank of ``module`` can be forked from this process, else ``exec``; a value of
    :data:`START_ENV` other than the two is a ConfigError."""
    from disttrain.errors import ConfigError

    asked = env.get(START_ENV, "fork")
    if asked not in ("fork", "exec"):
        raise ConfigError(f"{START_ENV} must be 'fork' or 'exec', got {asked!r}")
    if asked == "exec" or device_type != "cpu" or not hasattr(os, "fork") or not defines_entry(module):
        return "exec"
    if module.startswith("disttrain."):  # ours: imported here, once, so that every rank (and attempt) starts with it
        importlib.import_module(module)
    return "fork"


def defines_entry(module: str) -> bool:
    """Whether ``module``'s source defines ``entry`` at its top level: read, not run (a user's module may train
    when imported); False where it is not a plain ``.py`` file that can be found."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and bool(spec.origin) and source_defines_entry(Path(str(spec.origin)))


def source_defines_entry(path: Path) -> bool:
    """Whether the Python file ``path`` defines ``entry`` at its top level (read, not run)."""
    if path.suffix != ".py":
        return False
    try:
        source = path.read_text(encoding="utf-8")
        with _PARSE_LOCK:
            tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    return any(isinstance(node, ast.FunctionDef) and node.name == "entry" for node in tree.body)


def forked_worker(module: str, *argv: str) -> None:
    """A rank forked by torchrun's agent (which calls it with the rank's environment set): run ``module``'s
    ``entry(argv)`` as ``python -u -m module argv`` would, and leave with its exit code. Returns (which tells
    the agent the rank succeeded) only for exit code 0."""
    success_returns(True)  # an exit_now(0) deep in the entry unwinds to here
    code = _run_entry(module, list(argv))
    if code:
        exit_now(code)
    # the agent learns of a success from the return value its wrapper sends on; then, first thing as this
    # process shuts down, leave without joining threads or running destructors (gloo's can deadlock)
    multiprocessing.util.Finalize(None, _leave, exitpriority=100)


def _leave() -> None:
    success_returns(False)
    exit_now(0)


def _run_entry(module: str, argv: list[str]) -> int:
    """``module``'s ``entry(argv)`` in this freshly forked process, set up as a fresh interpreter would be; its
    exit code (1 for an exception, printed by the interpreter's hook)."""
    for sig in _RESET_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    if all(os.environ.get(k) == v for k, v in CPU_MALLOC_ENV.items()):
        keep_large_buffers()
    sys.argv = [module, *argv]
    try:
        return int(importlib.import_module(module).entry(argv) or 0)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        return 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1


class ForkedProcess:
    """A worker forked from this process by :func:`fork_process`, with the part of ``subprocess.Popen``'s
    interface that a launcher watching its workers uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (``-N`` for signal N) once it has exited, else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_process(
    module: str, argv: list[str], env: Mapping[str, str], stdout: int | None, stderr: int | None
) -> ForkedProcess:
    """``python -u -m module argv`` with environment ``env`` (and the file descriptors ``stdout`` and
    ``stderr``, where not None), forked from this process: for a launcher that starts and watches its workers
    itself (:mod:`disttrain.launch.direct`)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else what this process had buffered would be written again by the child
    pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    code = 1
    try:  # the child: never returns into the launcher's code
        os.environ.clear()
        os.environ.update(env)
        for fd, target in ((1, stdout), (2, stderr)):
            if target is not None:
                os.dup2(target, fd)
        code = _run_entry(module, argv)
    finally:
        exit_now(code)
    raise AssertionError("not reached")
