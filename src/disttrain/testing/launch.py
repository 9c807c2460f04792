"""Running things the way users run them, for tests and benchmarks: the real ``disttrain`` command, and a
script on N ranks through ``disttrain launch`` (torchrun semantics) whose ranks each leave a JSON result.

The launch-and-collect protocol: :func:`launch_and_collect` appends ``--out DIR`` to the script's arguments;
each rank writes ``DIR/rank<r>.json`` (:func:`write_rank_result`) and leaves (:func:`finish_worker`); the
caller gets the ranks' results in rank order. Each rank process costs ~2 s of imports on a small machine, so
one launch runs several checks (variants, rounds) and returns them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from typing_extensions import Unpack

from disttrain.launch.forked import source_defines_entry

DISTTRAIN = Path(sys.executable).with_name("disttrain")
"""The ``disttrain`` console script of this Python environment."""

T = TypeVar("T")


class LaunchError(RuntimeError):
    """A launched command failed; the message ends with the tail of its output."""


def child_env(
    *pythonpath: str | Path, base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A child process's environment: ``base`` (default: this process's) with one intra-op thread per process,
    unbuffered output, ``pythonpath`` ahead of its PYTHONPATH, and ``extra`` variables."""
    env = dict(os.environ if base is None else base)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    paths = [str(p) for p in pythonpath] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_disttrain(
    *args: str, cwd: Path | None = None, timeout: float = 240, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real ``disttrain`` command, its output captured; ``env`` is the whole environment (default
    :func:`child_env`)."""
    return subprocess.run(
        [str(DISTTRAIN), *args],
        cwd=cwd,
        env=dict(child_env() if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def import_root(script: Path) -> Path | None:
    """The folder above the package that ``script`` belongs to (None when it is in none): on PYTHONPATH, the
    script, run by its path, can import its siblings as ``package.module``."""
    folder, top = script.resolve().parent, None
    while (folder / "__init__.py").is_file():
        top, folder = folder, folder.parent
    return None if top is None else folder


class LaunchOptions(TypedDict, total=False):
    """:func:`launch`'s keyword options, for the functions that pass them on."""

    env: Mapping[str, str] | None
    cwd: Path | None
    timeout: float
    echo: bool | Callable[[str], bool]


def launch(
    nproc: int,
    script: Path,
    args: list[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
    echo: bool | Callable[[str], bool] = False,
) -> str:
    """``disttrain launch -n nproc script args``; its output (stdout and stderr together), or LaunchError with
    the output's tail. ``env``: the whole environment (default :func:`child_env`; a script inside a package
    gets the package's root on PYTHONPATH). ``echo``: print the output as it comes (a function: the lines for
    which it says True)."""
    root = import_root(script)
    full = dict(child_env() if env is None else env)
    if root is not None:
        full = child_env(root, base=full)
    program = [str(script)]
    if source_defines_entry(script):  # run as a module: on CPU its ranks fork from the launcher
        folder = root or script.resolve().parent
        full = child_env(folder, base=full)
        program = ["-m", ".".join(script.resolve().relative_to(folder).with_suffix("").parts)]
    cmd = [str(DISTTRAIN), "launch", "-n", str(nproc), *program, *args]
    proc = subprocess.Popen(cmd, env=full, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        proc.kill()

    killer = threading.Timer(timeout, stop)
    killer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if echo is True or (callable(echo) and echo(line)):
                print(line, end="", flush=True)
        code = proc.wait()
    finally:
        killer.cancel()
    if code != 0:
        why = f"killed after {timeout:.0f}s" if timed_out.is_set() else f"exit {code}"
        raise LaunchError(f"`{' '.join(cmd)}` failed ({why}):\n{''.join(lines)[-8000:]}")
    return "".join(lines)


def launch_and_collect(
    nproc: int, script: Path, args: list[str], **options: Unpack[LaunchOptions]
) -> list[dict[str, Any]]:
    """:func:`launch` ``script`` with ``--out DIR`` appended to ``args``; each rank's ``DIR/rank<r>.json``,
    in rank order."""
    with tempfile.TemporaryDirectory(prefix="disttrain-launch-") as out:
        launch(nproc, script, [*args, "--out", out], **options)
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(nproc)]


def is_worker() -> bool:
    """True inside a rank started by ``disttrain launch`` (torchrun sets RANK)."""
    return "RANK" in os.environ


def write_rank_result(out_dir: str | Path, rank: int, data: dict[str, Any]) -> None:
    """A rank's result for :func:`launch_and_collect`."""
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(data))


def finish_worker() -> None:
    """Leave the process group and exit at once, as ``disttrain.jobs.run_worker`` does: torch's gloo/DDP
    destructors can deadlock during interpreter teardown."""
    import torch.distributed as dist

    from disttrain.utils.process import exit_now

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    exit_now(0)


def together(*launches: Callable[[], T], at_once: int | None = None) -> list[T]:
    """Independent launches (``lambda: disttrain(...)``, ``lambda: launch_and_collect(...)``) at the same time
    (``at_once`` of them at most; default all), one thread each; their results in order (an exception in one is
    raised here). Each launch leaves a core idle for much of its start-up (imports, the launcher's planning),
    so two overlap in about 80% of the time of one after the other. Only for jobs whose results do not depend
    on timing."""
    with ThreadPoolExecutor(at_once or len(launches)) as pool:
        futures = [pool.submit(launch) for launch in launches]
        return [f.result() for f in futures]


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
