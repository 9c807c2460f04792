"""``disttrain ps --plan``'s predicted samples/s against the job's measured samples/s, on this host and on two hosts
joined by a rate-limited link.

(a) One host: for each variant (the default job; servers of their own, 4 processes; plain steps), the plan's
    prediction (``disttrain ps --plan``: the job's step timed as one process, the RPC link from doctor's
    cache) and the job itself, interleaved for ``--rounds`` rounds; measured = the median of the per-step
    samples/s in ``metrics.jsonl`` after 10 steps (start-up and evaluations left out, as the plan leaves them).
(b) Two hosts (network namespaces, each in its own PID namespace so that TensorPipe sends tensors over the
    link; :mod:`disttrain.testing.netns`), their link limited by tc's token bucket at each ``--rates`` rate:
    `disttrain doctor` across both (which caches the RPC link), `ps --plan --launch.nnodes 2`, then the job
    across both. Needs root and iproute2; skipped with the reason otherwise.

Ratio = measured / predicted; the plan states +-30% (``disttrain.jobs.ps_plan.ERROR``).

    .venv/bin/python -m benchmarks.bench_ps_plan [--rounds 3] [--rates 20mbit 100mbit] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from disttrain.jobs.ps_plan import ERROR
from disttrain.testing.launch import DISTTRAIN
from disttrain.testing.netns import two_hosts, why_not

PORT = 29_481
VARIANTS = {"default": [], "servers apart": ["--ps.colocate", "off"], "plain steps": ["--ps.overlap", "off"]}


def job_args(steps: int, root: Path, name: str) -> list[str]:
    quiet = ["--train.eval-interval", "0", "--train.eval-samples", "2000"]
    return ["ps", "--train.steps", str(steps), *quiet, "--run.root", str(root), "--run.name", name]


def predicted(stdout: str) -> float:
    line = next(x for x in stdout.splitlines() if x.startswith("speed"))
    return float(line.split("~")[1].split()[0].replace(",", ""))


def measured(run: Path) -> float:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return statistics.median([r["samples_per_s"] for r in recs if "samples_per_s" in r][10:])


def checked(done: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


def one_host(rounds: int, steps: int, tmp: Path) -> list[list[Any]]:
    got: dict[str, dict[str, list[float]]] = {v: {"predicted": [], "measured": []} for v in VARIANTS}
    for r in range(rounds):
        order = list(VARIANTS)[r % len(VARIANTS) :] + list(VARIANTS)[: r % len(VARIANTS)]
        for v in order:
            args = [*job_args(steps, tmp, f"{v.replace(' ', '-')}-{r}"), *VARIANTS[v]]
            plan = checked(subprocess.run([str(DISTTRAIN), *args, "--plan"], capture_output=True, text=True), v)
            checked(subprocess.run([str(DISTTRAIN), *args], capture_output=True, text=True), v)
            got[v]["predicted"].append(predicted(plan.stdout))
            got[v]["measured"].append(measured(tmp / args[args.index("--run.name") + 1]))
    rows = []
    for v, g in got.items():
        ratios = [m / p for m, p in zip(g["measured"], g["predicted"], strict=True)]
        want, seen = statistics.median(g["predicted"]), statistics.median(g["measured"])
        rows.append(["one host", v, want, seen, statistics.median(ratios)])
    return rows


def two_hosts_at(rate: str, steps: int, tmp: Path) -> list[Any]:
    with two_hosts(own_pids=True) as (a, b):
        for h in (a, b):
            h.limit(rate)
        nodes = ["--launch.nnodes", "2", "--launch.rdzv-endpoint", f"{a.addr}:{PORT}"]
        caches = [tmp / f"cache-{rate}-a", tmp / f"cache-{rate}-b"]
        doctors = [
            h.disttrain("doctor", *nodes, "--launch.node-rank", str(r), env={"DISTTRAIN_CACHE_DIR": str(caches[r])})
            for r, h in enumerate((a, b))
        ]
        for p in doctors:
            out, err = p.communicate(timeout=600)
            checked(subprocess.CompletedProcess(p.args, p.returncode, out, err), f"doctor at {rate}")
        args = job_args(steps, tmp, f"two-{rate}")
        env = {**os.environ, "DISTTRAIN_CACHE_DIR": str(caches[0])}
        plan = subprocess.run(
            a.cmd(str(DISTTRAIN), *args, "--plan", "--launch.nnodes", "2"), env=env, capture_output=True, text=True
        )
        checked(plan, f"plan at {rate}")
        jobs = [h.disttrain(*args, *nodes, "--launch.node-rank", str(r)) for r, h in enumerate((a, b))]
        for p in jobs:
            out, err = p.communicate(timeout=900)
            checked(subprocess.CompletedProcess(p.args, p.returncode, out, err), f"job at {rate}")
    want, got = predicted(plan.stdout), measured(tmp / f"two-{rate}")
    print(plan.stdout, flush=True)
    return [f"two hosts, {rate}", "default", want, got, got / want]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rates", nargs="*", default=["20mbit", "100mbit"])
    args = p.parse_args(argv)
    C.print_machine()
    with tempfile.TemporaryDirectory(prefix="bench-ps-plan-") as t:
        tmp = Path(t)
        rows = one_host(args.rounds, args.steps, tmp)
        reason = why_not()
        if reason is None:
            rows += [two_hosts_at(rate, args.steps, tmp) for rate in args.rates]
        else:
            print(f"two hosts skipped: {reason}", flush=True)
    text = C.table(
        ["where", "job", "predicted samples/s", "measured samples/s", "measured / predicted"],
        rows,
        title=f"disttrain ps --plan against the job (the plan states +-{ERROR:.0%})",
    )
    within = sum(abs(r[4] - 1) <= ERROR for r in rows)
    print(f"within +-{ERROR:.0%}: {within} of {len(rows)}", flush=True)
    C.write_results("bench_ps_plan", {"table": text, "rows": rows, "rounds": args.rounds, "steps": args.steps})


if __name__ == "__main__":
    main(sys.argv[1:])
