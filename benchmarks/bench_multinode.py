"""Two hosts over a rate-limited link: tokens/s and the bytes that cross the node boundary per step for HSDP,
FSDP and DDP, and the time from a node's death to the one-line error on the other node.

Two network namespaces joined by a veth pair (``disttrain.testing.netns``: root), each running its own ``disttrain
run`` launcher with 2 ranks, both ends of the link limited to ``--rate`` by ``tc`` (netem, or tbf where the kernel
has none); every strategy trains the same GPT (4 x 256, context 64, fp32) with the same global batch. Bytes across
the boundary: host A's veth counters, sampled every 10 ms, between the first and last measured steps' records.
Death to error: an HSDP job loses host B (every process SIGKILLed) at step 6; host A's launcher is timed until it
exits, its stderr must say "lost contact with". All 4 ranks share this machine's cores: sharding's own work weighs
more than on real hosts; the bytes do not depend on that.
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

import numpy as np

from benchmarks import harness as H
from disttrain.testing.launch import DISTTRAIN, child_env, pids_mentioning
from disttrain.testing.netns import Host, two_hosts, why_not
from disttrain.testing.tiny import write_small_text

PORT = 29_571
WARMUP = 5  # steps left out of every figure
OPTIONS = {
    "steps": (30, f"optimizer steps per job (the first {WARMUP} are warm-up)"),
    **H.options(rounds=1),
    "rate": ("1gbit", "tc rate of each direction of the link"),
    "strategies": ("hsdp,fsdp,ddp", "comma-separated"),
    "no_death": (False, "skip the node-death measurement"),
}
QUICK = {"steps": 8}
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


# -- the link -----------------------------------------------------------------------------------------
def sh(*cmd: str, check: bool = True) -> str | None:
    """``cmd``'s output; when it fails, RuntimeError (or None, without ``check``)."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 and check:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout if proc.returncode == 0 else None


def limit_link(hosts: tuple[Host, Host], rate: str) -> str:
    """Limit both veth ends (each end's egress) to ``rate``; return the qdisc used."""
    qdisc = ["netem", "delay", "0.2ms", "rate", rate]
    for h in hosts:
        if sh(*h.cmd("tc", "qdisc", "add", "dev", h.veth, "root", *qdisc), check=False) is None:
            print("no netem in this kernel: tbf at the same rate, no added delay", flush=True)
            qdisc = ["tbf", "rate", rate, "burst", "256kb", "latency", "20ms"]
            sh(*h.cmd("tc", "qdisc", "replace", "dev", h.veth, "root", *qdisc))
    shown = [(sh(*h.cmd("tc", "qdisc", "show", "dev", h.veth)) or "").strip() for h in hosts]
    if not all(qdisc[0] in s and "rate" in s for s in shown):
        raise RuntimeError(f"the rate limit did not take: {shown}")
    print("link:\n  " + "\n  ".join(shown), flush=True)
    return " ".join(qdisc)


# -- one job on two hosts -----------------------------------------------------------------------------
def job_args(data: Path, root: Path, name: str, strategy: str, steps: int, *extra: str) -> list[str]:
    model = "--model.n-layers 4 --model.d-model 256 --model.n-heads 4 --model.context 64 --precision.dtype fp32"
    train = f"--train.global-batch 16 --train.micro-batch 4 --train.steps {steps} --train.eval-interval 0"
    quiet = "--train.generate-chars 0 --metrics.progress off --metrics.log-interval 1 --metrics.peak-tflops 1"
    job = f"--checkpoint.interval 0 --parallel.strategy {strategy} --run.root {root} --run.name {name}"
    return ["run", "--data.path", str(data), *f"{model} {train} {quiet} {job}".split(), *extra]


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


def measure(a: Host, b: Host, tmp: Path, data: Path, strategy: str, steps: int, port: int) -> dict[str, Any]:
    name = f"{strategy}-{port}"
    run, trace = tmp / name, tmp / f"{name}.veth"
    sampler = subprocess.Popen(a.cmd(sys.executable, "-c", SAMPLER, a.veth, str(trace)))
    t0, args = time.monotonic(), job_args(data, tmp, name, strategy, steps)
    try:
        codes = [p.wait(timeout=900) for p in launch(a, b, args, port, tmp / name)]
    finally:
        sampler.kill()
        sampler.wait()
    if codes != [0, 0]:
        err = [(tmp / f"{name}.{h.ns}.err").read_text()[-3000:] for h in (a, b)]
        raise SystemExit(f"{strategy} job failed (exit codes {codes}):\n" + "\n---\n".join(err))
    when = {r["step"]: r["time"] for r in H.records(run / "metrics.jsonl") if "loss" in r}
    first, last = WARMUP, max(when)
    t, tx, rx = np.loadtxt(trace, ndmin=2).T  # the counters between samples: linear
    moved = float(np.interp(when[last], t, tx + rx) - np.interp(when[first], t, tx + rx))
    plan = json.loads((run / "strategy.json").read_text())
    return {"strategy": strategy, "resolved": plan["strategy"], "n_params": plan["plan"]["n_params"]} | {
        "tokens_per_s": 16 * 64 * (last - first) / (when[last] - when[first]),
        "bytes_per_step": moved / (last - first),
        "wall_s": time.monotonic() - t0,
    }


# -- a node dies --------------------------------------------------------------------------------------
def death_to_error(tmp: Path, data: Path, port: int) -> dict[str, Any]:
    name = "death"
    extra = ("--parallel.timeout-s", "20", "--checkpoint.interval", "4")
    args = job_args(data, tmp, name, "hsdp", 1000, *extra)
    with two_hosts() as (a, b):
        procs, metrics = launch(a, b, args, port, tmp / name), tmp / name / "metrics.jsonl"
        H.wait_for("step 6", lambda: metrics.is_file() and '"step": 6,' in metrics.read_text(), procs, 300)
        b.kill_all()  # host B is gone: its launcher and its workers
        died = time.monotonic()
        code = procs[0].wait(timeout=300)
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
def on_two_hosts(args: argparse.Namespace, tmp: Path, data: Path) -> tuple[list[dict[str, Any]], str]:
    """Every strategy's job ``--rounds`` times (order rotating) on two hosts joined by the limited link."""
    with two_hosts() as (a, b):
        link = limit_link((a, b), args.rate)
        ports = itertools.count(PORT + 1)
        strategies = {
            s: lambda s=s: measure(a, b, tmp, data, s, args.steps, next(ports)) for s in args.strategies.split(",")
        }
        runs = H.side_by_side(strategies, args.rounds)
    return [r for rs in runs.values() for r in rs], link


def run(args: argparse.Namespace) -> dict[str, Any]:
    if (reason := why_not()) is not None:
        raise SystemExit(f"cannot make two hosts here: {reason}")
    if args.steps <= WARMUP + 2:
        raise SystemExit(f"--steps must be more than {WARMUP + 2} (the first {WARMUP} are warm-up)")
    with tempfile.TemporaryDirectory(prefix="disttrain-multinode-") as tmp_name:
        tmp = Path(tmp_name)
        data = write_small_text(tmp / "corpus.txt", 200_000)
        try:
            runs, link = on_two_hosts(args, tmp, data)
            death = None if args.no_death else death_to_error(tmp, data, PORT + 100)
        finally:
            left = pids_mentioning(tmp)
        if left:  # ours (their command lines name our temporary folder): say so, then end them
            print(f"WARNING: processes left behind, now killed: {left}", flush=True)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    return report(runs, args, death) | {"link": link, "left_behind": left, "runs": runs}


def report(runs: list[dict[str, Any]], args: argparse.Namespace, death: dict[str, Any] | None) -> dict[str, Any]:
    strategies = args.strategies.split(",")
    med = {
        s: {k: H.median([r[k] for r in runs if r["strategy"] == s]) for k in ("tokens_per_s", "bytes_per_step")}
        for s in strategies
    }
    ref = med.get("ddp") or med[strategies[-1]]
    rows = [
        {"strategy": s, "tokens/s": m["tokens_per_s"], "ratio to DDP": m["tokens_per_s"] / ref["tokens_per_s"]}
        | {"MB across the node boundary / step": m["bytes_per_step"] / 1e6}
        | {"ratio to DDP ": m["bytes_per_step"] / ref["bytes_per_step"]}
        for s, m in med.items()
    ]
    n_params = runs[0]["n_params"]
    model = f"GPT {n_params:,} params = {n_params * 4 / 1e6:.2f} MB fp32, global batch 16 x 64 tokens"
    H.table(rows, f"2 hosts x 2 ranks, link {args.rate} each way; {model}; steps {WARMUP}-{args.steps}")
    print(THEORY, flush=True)
    if death is not None:
        print(f"node death -> error on host A: {death['seconds']:.1f} s, exit code {death['exit_code']}, ", end="")
        print(f"'lost contact with' in stderr: {death['lost_contact']}\n  {death['line']}", flush=True)
    return {"rows": rows, "n_params": n_params, "death": death}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
