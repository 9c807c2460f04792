"""``disttrain ps --plan``'s predicted samples/s against the job's measured samples/s, on this host and on two hosts
joined by a rate-limited link. Ratio = measured / predicted; the plan states +-30% (``jobs.ps_plan.ERROR``).

(a) One host: per variant (the default job; servers of their own; plain steps), the plan and the job itself,
    interleaved for ``--rounds`` rounds; measured = the median per-step samples/s in ``metrics.jsonl`` after 10
    steps (start-up and evaluations left out, as the plan leaves them).
(b) Two hosts (network namespaces, each in its own PID namespace so that TensorPipe sends tensors over the link),
    their link limited by tc at each ``--rates`` rate: ``disttrain doctor`` across both (it caches the RPC link),
    ``ps --plan --launch.nnodes 2``, then the job across both. Needs root; skipped with the reason otherwise.

    .venv/bin/python -m benchmarks.bench_ps_plan [--rounds 3] [--rates 20mbit 100mbit] [--steps 200]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness as H
from disttrain.jobs.ps_plan import ERROR
from disttrain.testing.launch import DISTTRAIN
from disttrain.testing.netns import Host, two_hosts, why_not

PORT = 29_481
VARIANTS = {"default": "", "servers apart": "--ps.colocate off", "plain steps": "--ps.overlap off"}
OPTIONS = {
    "rounds": (3, "rounds of every variant"),
    "steps": (200, "steps per job"),
    "rates": (["20mbit", "100mbit"], "link rates"),
}
QUICK = {"rounds": 1, "steps": 20, "rates": ["100mbit"]}


def job_args(steps: int, root: Path, name: str) -> list[str]:
    quiet = "--train.eval-interval 0 --train.eval-samples 2000"
    return f"ps --train.steps {steps} {quiet} --run.root {root} --run.name {name}".split()


def predicted(stdout: str) -> float:
    line = next(x for x in stdout.splitlines() if x.startswith("speed"))
    return float(line.split("~")[1].split()[0].replace(",", ""))


def measured(run: Path) -> float:
    return H.median([r["samples_per_s"] for r in H.records(run / "metrics.jsonl") if "samples_per_s" in r][10:])


def one_host(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    count = itertools.count()

    def plan_and_job(options: str) -> tuple[float, float]:
        job = [*job_args(args.steps, tmp, name := f"job{next(count)}"), *options.split()]
        plan = H.command([str(DISTTRAIN), *job, "--plan"])
        H.command([str(DISTTRAIN), *job])
        return predicted(plan.stdout), measured(tmp / name)

    got = H.side_by_side({v: functools.partial(plan_and_job, o) for v, o in VARIANTS.items()}, args.rounds)
    return [
        {"where": "one host", "job": v, "predicted samples/s": H.median([p for p, _ in g])}
        | {"measured samples/s": H.median([m for _, m in g]), "measured / predicted": H.median([m / p for p, m in g])}
        for v, g in got.items()
    ]


def wait_all(procs: list[subprocess.Popen[str]], what: str, timeout: float) -> None:
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"{what} failed ({p.returncode}):\n{out[-2000:]}\n{err[-3000:]}")


def two_hosts_at(rate: str, steps: int, tmp: Path) -> dict[str, Any]:
    with two_hosts(own_pids=True) as (a, b):
        hosts: tuple[Host, Host] = (a, b)
        for h in hosts:
            h.limit(rate)
        nodes = ["--launch.nnodes", "2", "--launch.rdzv-endpoint", f"{a.addr}:{PORT}"]
        caches = [tmp / f"cache-{rate}-{r}" for r in range(2)]
        cache_env = [{"DISTTRAIN_CACHE_DIR": str(c)} for c in caches]
        doctors = [
            h.disttrain("doctor", *nodes, "--launch.node-rank", str(r), env=cache_env[r]) for r, h in enumerate(hosts)
        ]
        wait_all(doctors, f"doctor at {rate}", 600)
        job = job_args(steps, tmp, f"two-{rate}")
        plan = H.command(
            a.cmd(str(DISTTRAIN), *job, "--plan", "--launch.nnodes", "2"), env={**os.environ, **cache_env[0]}
        )
        wait_all(
            [h.disttrain(*job, *nodes, "--launch.node-rank", str(r)) for r, h in enumerate(hosts)],
            f"job at {rate}",
            900,
        )
    want, got = predicted(plan.stdout), measured(tmp / f"two-{rate}")
    print(plan.stdout, flush=True)
    return {"where": f"two hosts, {rate}", "job": "default", "predicted samples/s": want, "measured samples/s": got} | {
        "measured / predicted": got / want
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ps-plan-") as t:
        rows = one_host(args, Path(t))
        if (reason := why_not()) is None:
            rows += [two_hosts_at(rate, args.steps, Path(t)) for rate in args.rates]
        else:
            print(f"two hosts skipped: {reason}", flush=True)
    H.table(rows, f"disttrain ps --plan against the job (the plan states +-{ERROR:.0%})")
    within = sum(abs(r["measured / predicted"] - 1) <= ERROR for r in rows)
    print(f"within +-{ERROR:.0%}: {within} of {len(rows)}", flush=True)
    return {"rows": rows, "goals": [H.Goal(f"rows within +-{ERROR:.0%}", len(rows)).check(within)]}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
