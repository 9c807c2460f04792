"""`disttrain launch` gives a script torchrun's environment and restarts it; `run` on one process needs no group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from disttrain.launch.torchrun import worker_env_defaults
from disttrain.testing.tiny import tiny_cli_args
from disttrain.utils.host import reserved_port
from disttrain.utils.malloc import CPU_MALLOC_ENV

from conftest import disttrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = """
import json, os, socket, sys
from pathlib import Path
out = Path(sys.argv[1])
probe = socket.socket()
try:  # nobody listens on MASTER_PORT here (no store); the launcher holds it from every other process
    probe.bind(("", int(os.environ["MASTER_PORT"])))
    held = False
except OSError:
    held = True
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
                                      "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")}
(out / f"attempt{attempt}.rank{rank}.json").write_text(json.dumps({"env": env, "args": sys.argv[2:], "held": held}))
if attempt == 0 and rank == 1:
    sys.exit(3)  # the first attempt fails on one rank; torchrun restarts the whole group
"""


def test_launch_sets_torchrun_env_and_restarts(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = disttrain("launch", "-n", "2", "--max-restarts", "1", str(script), str(tmp_path), "--flag", "x")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for attempt in (0, 1):
        for rank in (0, 1):
            got = json.loads((tmp_path / f"attempt{attempt}.rank{rank}.json").read_text())
            assert got["env"]["RANK"] == str(rank) and got["env"]["WORLD_SIZE"] == "2"
            assert got["env"]["LOCAL_RANK"] == str(rank) and got["env"]["OMP_NUM_THREADS"] == "1"
            assert got["args"] == ["--flag", "x"]
            assert got["held"], "the agent's MASTER_PORT was free for any process to take before rank 0 listens"
            # CPU workers: glibc serves large buffers from its heap and keeps them (no fresh pages every step)
            assert {k: got["env"][k] for k in CPU_MALLOC_ENV} == CPU_MALLOC_ENV


def test_a_reserved_port_is_never_handed_out_and_a_store_can_still_listen_on_it() -> None:
    """The race behind a rare ``EADDRINUSE`` at the rendezvous: a port picked free, then taken by another
    process's automatic pick before rank 0 listens. A held port is skipped by the kernel's picks (60,000 of them,
    over twice the ephemeral range), and c10d's store listens on it."""
    port = reserved_port()
    picks = subprocess.run(
        [sys.executable, "-c", PICKS, str(port)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert picks.strip() == "0", picks
    for libuv in (True, False):
        store = dist.TCPStore("127.0.0.1", port, is_master=True, use_libuv=libuv, timeout=timedelta(seconds=10))
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert store.get("k") == b"v"
        del client, store


PICKS = """
import socket, sys
port, hits = int(sys.argv[1]), 0
for _ in range(60000):
    with socket.socket() as s:
        s.bind(("", 0))
        hits += s.getsockname()[1] == port
print(hits)
"""


def test_cpu_workers_get_the_allocator_settings_unless_the_user_set_any() -> None:
    env: dict[str, str] = {}
    worker_env_defaults(env, 2, "cpu")
    assert CPU_MALLOC_ENV.items() <= env.items() and env["OMP_NUM_THREADS"] == "1"
    for mine in ({"MALLOC_ARENA_MAX": "2"}, {"DISTTRAIN_CPU_MALLOC": "glibc"}):  # the user's own choice
        worker_env_defaults(mine, 2, "cpu")
        assert not any(k in mine for k in CPU_MALLOC_ENV), mine
    gpu: dict[str, str] = {}
    worker_env_defaults(gpu, 2, "cuda")
    assert not any(k.startswith("MALLOC_") for k in gpu)


def test_launch_reports_a_failure_without_restarts(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = disttrain("launch", "-n", "2", str(script), str(tmp_path))
    assert proc.returncode == 1
    assert "disttrain: rank 1 failed with exit code 3" in proc.stderr


def test_single_process_run_needs_no_process_group(tmp_path: Path, small_text: Path) -> None:
    extra = ["--parallel.nproc", "1", "--train.generate-chars", "10", "--run.root", str(tmp_path)]
    proc = disttrain(*tiny_cli_args(small_text, 3, *extra, model=(1, 32, 2), job=False), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "strategy single x 1 rank(s)" in proc.stdout
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert json.loads((run / "summary.json").read_text())["strategy"] == "single"


FRESH_PAGES = """
import resource, sys, torch
from disttrain.utils.malloc import keep_large_buffers_here
if sys.argv[1] == "keep":
    assert keep_large_buffers_here()
src = torch.ones(48 * 2**18)  # 48 MiB: above glibc's 32 MiB mmap ceiling
# torch asks for 64-byte aligned memory: a freed buffer is a little too small for the next aligned request, so the
# heap grows for the first few buffers (up to 9 here, by where ASLR puts it) until the freed ones coalesce
for _ in range(16):
    torch.empty_like(src).copy_(src)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.empty_like(src).copy_(src)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_an_in_process_job_keeps_large_buffers_instead_of_faulting_fresh_pages_every_time() -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    faults = {
        m: int(
            subprocess.run(
                [sys.executable, "-c", FRESH_PAGES, m],
                capture_output=True,
                text=True,
                env={**env, "OMP_NUM_THREADS": "1"},
                check=True,
            ).stdout
        )
        for m in ("keep", "glibc")
    }
    # glibc's default maps each 48 MiB buffer afresh: its pages fault in every time (12k 4 KiB pages, or 24 huge
    # pages with transparent huge pages); kept in the heap, once it has grown, the next 20 buffers fault in nothing
    assert faults["glibc"] >= 20 * 20 and faults["keep"] < faults["glibc"] / 10, faults


CONSOLE = """
import subprocess, sys
say = "from disttrain.utils.process import say_on_console; say_on_console('rank 1: lost contact with B')"
with open(sys.argv[1], "w") as log:  # torchrun --redirects: a rank's output goes to its log file
    redirect = {"stdout": log, "stderr": log} if sys.argv[2] == "redirected" else {}
    sys.exit(subprocess.run([sys.executable, "-c", say], **redirect).returncode)
"""


@pytest.mark.parametrize("output", ["redirected", "console"])
def test_a_rank_says_why_it_stops_on_the_console_even_where_its_output_goes_to_a_file(
    tmp_path: Path, output: str
) -> None:
    import subprocess
    import sys

    log = tmp_path / "rank1.log"
    proc = subprocess.run([sys.executable, "-c", CONSOLE, str(log), output], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("rank 1: lost contact with B") == 1 and log.read_text() == "", (proc.stderr, output)
