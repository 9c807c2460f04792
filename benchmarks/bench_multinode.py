"""Two hosts over a rate-limited link: tokens/s and the bytes that cross the node boundary per step for HSDP,
FSDP and DDP, and the time from a node's death to the one-line error on the other node.

Two Linux network namespaces joined by a veth pair stand for two hosts (``disttrain.testing.netns``: needs root
and iproute2); each runs its own ``disttrain run`` launcher with 2 ranks (4 ranks in all, rendezvous on host
A). Both ends of the link are limited to 1 Gbit/s with ``tc`` (netem ``delay 0.2ms rate 1gbit``, or tbf at
the same rate and no added delay where the kernel has no netem); a 32 MiB TCP transfer checks the limit.
Every strategy trains the same GPT (4 blocks, width 256, context 64, fp32) with the same global batch.

- tokens/s: from the run's ``metrics.jsonl`` (one record per step), steps after the warm-up only;
- bytes across the boundary: host A's veth counters (tx + rx), sampled every 10 ms by a process inside host
  A and read at the times of the records of the first and last measured step, so start-up, the final
  evaluation and the final save are left out (the last column: the whole job's bytes / steps);
- death to error: on a fresh pair of hosts without the limit, an HSDP job (``--parallel.timeout-s 20``,
  a checkpoint every 4 steps) loses host B (every process SIGKILLed) at step 6; we time host A's launcher
  until it exits and check its stderr says "lost contact with".

All 4 ranks share this machine's cores, so sharding's own work (collectives inside a node) weighs more than it
would on real hosts; the bytes across the link do not depend on that.

    .venv/bin/python -m benchmarks.bench_multinode [--steps 30] [--repeats 1] [--rate 1gbit]  # as root

(the figures in docs/performance.md: ``--repeats 2``, about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from disttrain.testing.launch import DISTTRAIN, child_env, pids_mentioning
from disttrain.testing.netns import Host, two_hosts, why_not
from disttrain.testing.tiny import write_small_text

PORT = 29_571
STRATEGIES = ("hsdp", "fsdp", "ddp")
WARMUP = 5  # steps left out of every figure
THEORY = (
    "theory (rings, 2 ranks per node, both directions together): DDP's all-reduce over 4 ranks ~3x the model's "
    "bytes, HSDP's all-reduce of half-shards between the nodes ~2x, FSDP's 2 all-gathers + 1 reduce-scatter ~4.5x"
)
SAMPLER = """
import sys, time
tx, rx = (f"/sys/class/net/{sys.argv[1]}/statistics/{k}_bytes" for k in ("tx", "rx"))
with open(sys.argv[2], "w", buffering=1) as out:
    while True:
        out.write(f"{time.time()} {open(tx).read().strip()} {open(rx).read().strip()}\\n")
        time.sleep(0.01)
"""
RECEIVER = """
import socket, sys, time
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
c, _ = s.accept()
n, t0 = 0, None
while chunk := c.recv(1 << 20):
    t0 = t0 or time.perf_counter()
    n += len(chunk)
print(n, time.perf_counter() - t0)
"""
SENDER = """
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
        break
    except OSError:
        time.sleep(0.05)
c.sendall(bytes(int(sys.argv[3])))
c.close()
"""


# -- the link -----------------------------------------------------------------------------------------
def sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


def limit_link(hosts: tuple[Host, Host], rate: str) -> str:
    """Limit both veth ends (each end's egress) to ``rate``; return the qdisc used."""
    qdisc = ["netem", "delay", "0.2ms", "rate", rate]
    for h in hosts:
        try:
            sh(*h.cmd("tc", "qdisc", "add", "dev", h.veth, "root", *qdisc))
        except RuntimeError as e:
            if "unknown" not in str(e) or qdisc[0] != "netem":
                raise
            print("no netem in this kernel: tbf at the same rate, no added delay", flush=True)
            qdisc = ["tbf", "rate", rate, "burst", "256kb", "latency", "20ms"]
            sh(*h.cmd("tc", "qdisc", "add", "dev", h.veth, "root", *qdisc))
    shown = [sh(*h.cmd("tc", "qdisc", "show", "dev", h.veth)).strip() for h in hosts]
    if not all(qdisc[0] in s and "rate" in s for s in shown):
        raise RuntimeError(f"the rate limit did not take: {shown}")
    print("link:\n  " + "\n  ".join(shown), flush=True)
    return " ".join(qdisc)


def transfer_gbit(a: Host, b: Host, port: int, nbytes: int = 32 << 20) -> float:
    """Gbit/s of one TCP stream from host B to host A."""
    py = sys.executable
    recv = subprocess.Popen(a.cmd(py, "-c", RECEIVER, a.addr, str(port)), stdout=subprocess.PIPE, text=True)
    subprocess.run(b.cmd(py, "-c", SENDER, a.addr, str(port), str(nbytes)), check=True, timeout=60)
    n, secs = recv.communicate(timeout=60)[0].split()
    return int(n) * 8 / float(secs) / 1e9


# -- one job on two hosts -----------------------------------------------------------------------------
def job_args(data: Path, root: Path, name: str, strategy: str, steps: int, *extra: str) -> list[str]:
    return [
        "run",
        "--data.path",
        str(data),
        "--model.n-layers",
        "4",
        "--model.d-model",
        "256",
        "--model.n-heads",
        "4",
        "--model.context",
        "64",
        "--precision.dtype",
        "fp32",
        "--train.global-batch",
        "16",
        "--train.micro-batch",
        "4",
        "--train.steps",
        str(steps),
        "--train.eval-interval",
        "0",
        "--train.generate-chars",
        "0",
        "--metrics.progress",
        "off",
        "--metrics.log-interval",
        "1",
        "--metrics.peak-tflops",
        "1",
        "--checkpoint.interval",
        "0",
        "--parallel.strategy",
        strategy,
        "--run.root",
        str(root),
        "--run.name",
        name,
        *extra,
    ]


def launch(a: Host, b: Host, args: list[str], port: int, logs: Path) -> list[subprocess.Popen[str]]:
    """One launcher per host (2 ranks each), output to files (pipes nobody reads could fill and block)."""
    nodes = ["--parallel.nproc", "2", "--launch.nnodes", "2", "--launch.rdzv-endpoint", f"{a.addr}:{port}"]
    procs = []
    for rank, h in enumerate((a, b)):
        cmd = h.cmd(str(DISTTRAIN), *args, *nodes, "--launch.node-rank", str(rank))
        out, err = (open(logs.with_suffix(f".{h.ns}.{k}"), "w") for k in ("out", "err"))  # noqa: SIM115
        procs.append(subprocess.Popen(cmd, env=child_env(), stdout=out, stderr=err, text=True, start_new_session=True))
        out.close()
        err.close()
    return procs


def finish(procs: list[subprocess.Popen[str]], hosts: tuple[Host, Host], timeout: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for h in hosts:
            h.kill_all()
        for p in procs:
            p.wait(timeout=30)
        raise


def veth_bytes(host: Host) -> int:
    """tx + rx bytes of the host's end of the link so far."""
    paths = [f"/sys/class/net/{host.veth}/statistics/{k}_bytes" for k in ("tx", "rx")]
    return sum(int(x) for x in sh(*host.cmd("cat", *paths)).split())


def bytes_at(samples: list[tuple[float, int]], t: float) -> float:
    """Counter value at time ``t``, linear between the two samples around it."""
    for (t0, b0), (t1, b1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * (t - t0) / max(t1 - t0, 1e-9)
    raise RuntimeError(f"no counter samples around {t}")


def measure(a: Host, b: Host, tmp: Path, data: Path, strategy: str, steps: int, port: int) -> dict[str, Any]:
    name = f"{strategy}-{port}"
    run, trace = tmp / name, tmp / f"{name}.veth"
    sampler = subprocess.Popen(a.cmd(sys.executable, "-c", SAMPLER, a.veth, str(trace)))
    before, t0 = veth_bytes(a), time.monotonic()
    try:
        codes = finish(launch(a, b, job_args(data, tmp, name, strategy, steps), port, tmp / name), (a, b), 900)
    finally:
        sampler.kill()
        sampler.wait()
    wall, whole = time.monotonic() - t0, veth_bytes(a) - before
    if codes != [0, 0]:
        err = [(tmp / f"{name}.{h.ns}.err").read_text()[-3000:] for h in (a, b)]
        raise SystemExit(f"{strategy} job failed (exit codes {codes}):\n" + "\n---\n".join(err))
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    when = {r["step"]: r["time"] for r in recs if "loss" in r}
    first, last = WARMUP, max(when)
    samples = [(float(t), int(tx) + int(rx)) for t, tx, rx in (x.split() for x in trace.read_text().splitlines())]
    moved = bytes_at(samples, when[last]) - bytes_at(samples, when[first])
    tokens = 16 * 64 * (last - first)
    plan = json.loads((run / "strategy.json").read_text())
    return {
        "strategy": strategy,
        "resolved": plan["strategy"],
        "n_params": plan["plan"]["n_params"],
        "steps_measured": [first, last],
        "tokens_per_s": tokens / (when[last] - when[first]),
        "step_s": (when[last] - when[first]) / (last - first),
        "bytes_per_step": moved / (last - first),
        "whole_job_bytes": whole,
        "whole_job_bytes_per_step": whole / steps,
        "wall_s": wall,
    }


# -- a node dies --------------------------------------------------------------------------------------
def wait_for_step(run: Path, step: int, procs: list[subprocess.Popen[str]], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run / "metrics.jsonl").is_file() and f'"step": {step},' in (run / "metrics.jsonl").read_text():
            return
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"the job ended before step {step}: exit codes {[p.poll() for p in procs]}")
        time.sleep(0.02)
    raise RuntimeError(f"step {step} never came")


def death_to_error(tmp: Path, data: Path, port: int) -> dict[str, Any]:
    name = "death"
    extra = ("--parallel.timeout-s", "20", "--checkpoint.interval", "4")
    args = job_args(data, tmp, name, "hsdp", 1000, *extra)
    with two_hosts() as (a, b):
        procs = launch(a, b, args, port, tmp / name)
        try:
            wait_for_step(tmp / name, 6, procs)
        except Exception:
            for h in (a, b):
                h.kill_all()
            raise
        b.kill_all()  # host B is gone: its launcher and its workers
        died = time.monotonic()
        code = finish(procs[:1], (a, b), 300)[0]
        took = time.monotonic() - died
        procs[1].wait(timeout=30)
    err = (tmp / f"{name}.{a.ns}.err").read_text()
    lines = [x for x in err.splitlines() if "lost contact with" in x]
    return {
        "seconds": took,
        "exit_code": code,
        "lost_contact": bool(lines),
        "line": lines[0].strip() if lines else "\n".join(err.strip().splitlines()[-3:]),
        "traceback": "Traceback" in err,
        "host_b_addr": b.addr,
    }


# -- the benchmark ------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per job (the first 5 are warm-up)")
    p.add_argument("--repeats", type=int, default=1, help="jobs per strategy (order rotated; medians)")
    p.add_argument("--rate", default="1gbit", help="tc rate of each direction of the link")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--no-death", action="store_true", help="skip the node-death measurement")
    args = p.parse_args(argv)
    if (reason := why_not()) is not None:
        raise SystemExit(f"cannot make two hosts here: {reason}")
    if args.steps <= WARMUP + 2:
        raise SystemExit(f"--steps must be more than {WARMUP + 2} (the first {WARMUP} are warm-up)")
    strategies = args.strategies.split(",")
    C.print_machine()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="disttrain-multinode-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "corpus.txt"
        write_small_text(data, 200_000)
        try:
            with two_hosts() as (a, b):
                free = transfer_gbit(a, b, PORT - 1)
                kind = limit_link((a, b), args.rate)
                limited = transfer_gbit(a, b, PORT - 2)
                print(f"one TCP stream B -> A: {free:.2f} Gbit/s without the limit, {limited:.2f} with", flush=True)
                port = PORT
                for r in range(args.repeats):
                    k = r % len(strategies)
                    for s in strategies[k:] + strategies[:k]:
                        port += 1
                        runs.append(measure(a, b, tmp, data, s, args.steps, port))
                        x = runs[-1]
                        print(
                            f"{s}: {x['tokens_per_s']:,.0f} tokens/s, {x['bytes_per_step'] / 1e6:.1f} MB/step "
                            f"across the link, job {x['wall_s']:.0f} s",
                            flush=True,
                        )
            death = None if args.no_death else death_to_error(tmp, data, PORT + 100)
        finally:
            left = pids_mentioning(tmp)
        if left:  # ours (their command lines name our temporary folder): say so, then end them
            print(f"WARNING: processes left behind, now killed: {left}", flush=True)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    report(runs, strategies, args, kind, free, limited, death, left)


def report(
    runs: list[dict[str, Any]],
    strategies: list[str],
    args: argparse.Namespace,
    kind: str,
    free: float,
    limited: float,
    death: dict[str, Any] | None,
    left: list[int],
) -> None:
    med = {
        s: {
            k: C.median([r[k] for r in runs if r["strategy"] == s])
            for k in ("tokens_per_s", "bytes_per_step", "whole_job_bytes_per_step")
        }
        for s in strategies
    }
    ref = med.get("ddp") or med[strategies[-1]]
    n_params = runs[0]["n_params"]
    model_mb = n_params * 4 / 1e6
    rows = [
        [
            s,
            med[s]["tokens_per_s"],
            med[s]["tokens_per_s"] / ref["tokens_per_s"],
            med[s]["bytes_per_step"] / 1e6,
            med[s]["bytes_per_step"] / ref["bytes_per_step"],
            med[s]["whole_job_bytes_per_step"] / 1e6,
        ]
        for s in strategies
    ]
    head = [
        "strategy",
        "tokens/s",
        "ratio to DDP",
        "MB across the node boundary / step",
        "ratio to DDP",
        "whole job's MB / step",
    ]
    title = (
        f"2 hosts x 2 ranks, link {args.rate} each way; GPT {n_params:,} params = {model_mb:.2f} MB fp32; "
        f"global batch 16 x 64 tokens; steps {WARMUP}-{args.steps} of {args.steps}, median of {args.repeats}"
    )
    C.table(head, rows, title=title)
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for row in rows:
        print(f"| {row[0]} | {row[1]:,.0f} | {row[2]:.2f} | {row[3]:.1f} | {row[4]:.2f} | {row[5]:.1f} |")
    print(THEORY, flush=True)
    if death is not None:
        print(
            f"node death -> error on host A: {death['seconds']:.1f} s, exit code {death['exit_code']}, "
            f"'lost contact with' in stderr: {death['lost_contact']}\n  {death['line']}",
            flush=True,
        )
    C.write_results(
        "bench_multinode",
        {
            "link": kind,
            "tcp_gbit_free": free,
            "tcp_gbit_limited": limited,
            "n_params": n_params,
            "medians": med,
            "runs": runs,
            "death": death,
            "left_behind": left,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
