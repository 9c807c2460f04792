"""The benchmark suite's harness: what every benchmark in ``benchmarks/`` runs through (benchmarks/README.md).

A benchmark declares its options (and the smaller values of its quick tier) and its goals, and hands :func:`main`
a ``run`` (the parent side) and, when it launches ranks, a ``worker``, or, when it has a baseline that runs as a
process of its own, a ``baseline``. The harness owns the rest: the command line, variants side by side in rotating
order, medians and paired ratios, tables, the goals' verdicts and ``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from disttrain.testing.launch import DISTTRAIN, finish_worker, is_worker, launch_and_collect, write_rank_result
from disttrain.utils.host import cpu_name

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
T = TypeVar("T")
Option = tuple[Any, ...]
"""``(default, help)`` or ``(default, help, choices)``; help None: an option only the workers get."""


# -- where we are -------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo")
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "amx": cpuinfo.exists() and "amx_bf16" in cpuinfo.read_text(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_avg_1m": os.getloadavg()[0],
    }


def one_thread() -> None:
    """One intra-op thread per process (per rank): the benchmarks compare per-core figures."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


# -- the command line and the goals -------------------------------------------------------------------
@dataclass(frozen=True)
class Goal:
    """What a benchmark promises: the figure ``what`` at least (or at most) ``value``."""

    what: str
    value: float
    higher_is_better: bool = True

    def check(self, x: float) -> dict[str, Any]:
        """Print the verdict on ``x`` and return it (for the results)."""
        sign = ">=" if self.higher_is_better else "<="
        verdict = "met" if (x >= self.value if self.higher_is_better else x <= self.value) else "MISSED"
        print(f"goal: {self.what} {sign} {self.value:g}: {x:.4g} {verdict}", flush=True)
        return {"goal": f"{self.what} {sign} {self.value:g}", "value": x, "verdict": verdict}


def parse(doc: str, options: Mapping[str, Option], quick: Mapping[str, Any], argv: list[str]) -> argparse.Namespace:
    """``--quick`` and every declared option (``steps_per_block`` is ``--steps-per-block``); with ``--quick``, the
    quick tier's values where the command line gives none. ``args.argv`` is ``argv``, for the workers."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the quick tier: small options that prove it runs")
    p.add_argument("--out", help=argparse.SUPPRESS)  # the workers' result folder (launch_and_collect)
    for name, (default, text, *choices) in options.items():
        kw: dict[str, Any] = {"default": default, "help": argparse.SUPPRESS if text is None else text}
        if isinstance(default, bool):
            kw["action"] = "store_true"
        elif isinstance(default, list):
            kw |= {"nargs": "+", "type": type(default[0])}
        elif default is not None:
            kw["type"] = type(default)
        p.add_argument("--" + name.replace("_", "-"), **kw, **({"choices": choices[0]} if choices else {}))
    if "--quick" in argv:
        p.set_defaults(**quick)
    args = p.parse_args(argv)
    args.argv = argv
    return args


COMMON = {
    "nproc": "ranks",
    "rounds": "rounds of the variants, side by side",
    "steps": "steps per job",
    "steps_per_block": "steps per timed block",
    "warmup": "untimed steps (runs) of each variant first",
    "launches": "fresh launches (the figure: the median over them)",
    "layers": "GPT blocks",
    "width": "GPT width",
    "heads": "attention heads",
    "context": "context length",
    "micro_batch": "micro-batch per rank",
    "seeds": "seeds (one run of each system per seed)",
    "timeout_s": "seconds before a run is given up",
    "seed": None,  # a baseline's (--baseline KIND --seed S)
}


def options(**defaults: Any) -> dict[str, Option]:
    """Options every benchmark that has them declares alike (:data:`COMMON`), with these defaults."""
    return {name: (default, COMMON[name]) for name, default in defaults.items()}


QUICK_BLOCKS = {"rounds": 1, "steps_per_block": 1, "warmup": 1}
QUICK_GPT = {"layers": 2, "width": 128, "heads": 4, "context": 64}


def main(
    script: str,
    doc: str,
    options: Mapping[str, Option],
    quick: Mapping[str, Any],
    run: Callable[[argparse.Namespace], dict[str, Any]],
    worker: Callable[[argparse.Namespace], dict[str, Any]] | None = None,
    baseline: Callable[[argparse.Namespace], dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """A benchmark's entry: in a launched rank, ``worker(args)`` (one thread) and its result back to the parent;
    with ``--baseline KIND`` (:func:`run_baseline`), ``baseline(args)``, its result the last line printed; else the
    machine header, ``run(args)`` and its results (``name`` in them: the file's name) in ``benchmarks/results``,
    which it returns."""
    args = parse(doc, {**options, "baseline": (None, None)}, quick, sys.argv[1:])
    if baseline is not None and args.baseline:
        print(json.dumps(baseline(args)), flush=True)
        return None
    if worker is not None and is_worker():
        one_thread()
        write_rank_result(args.out, int(os.environ["RANK"]), worker(args))
        finish_worker()
        return None
    m = machine()
    print(f"{m['date']}: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, load average {m['load_avg_1m']:.2f}")
    t0 = time.perf_counter()
    results = run(args)
    name = results.pop("name", Path(script).stem) + ("_quick" if args.quick else "")
    config = {k: v for k, v in vars(args).items() if k not in ("out", "argv", "baseline")}
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.0f} s", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"benchmark": name, "machine": machine(), "config": config, **results, "wall_s": wall}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"results: {path.relative_to(ROOT)}", flush=True)
    return results


def parts(args: argparse.Namespace, script: str, runs: Mapping[str, Callable[..., dict[str, Any]]]) -> dict[str, Any]:
    """The parts of a benchmark that ``--parts`` names (comma-separated, or a list), in the order of ``runs``:
    each part's results under its name, all their goals together; the results' name ``NAME_PART...`` unless
    every part ran."""
    chosen = args.parts.split(",") if isinstance(args.parts, str) else list(args.parts)
    if unknown := set(chosen) - set(runs):
        raise SystemExit(f"unknown --parts {sorted(unknown)}; choose from {', '.join(runs)}")
    results = {part: run(args) for part, run in runs.items() if part in chosen}
    goals = [g for r in results.values() for g in r.pop("goals", [])]
    name = Path(script).stem + ("" if len(results) == len(runs) else "_" + "_".join(results))
    return {"name": name, "goals": goals, **results}


def in_tmp(part: Callable[[argparse.Namespace, Path], T]) -> Callable[[argparse.Namespace], T]:
    """A part (of :func:`parts`) run as ``part(args, folder)`` in a temporary folder of its own, removed after it."""

    def run(args: argparse.Namespace) -> T:
        with tempfile.TemporaryDirectory(prefix="disttrain-bench-") as tmp:
            return part(args, Path(tmp))

    return run


# -- side by side -------------------------------------------------------------------------------------
def side_by_side(
    variants: Mapping[str, Callable[[], T]],
    rounds: int,
    *,
    warmup: int = 0,
    between_rounds: Callable[[int], None] | None = None,
) -> dict[str, list[T]]:
    """What each variant returns in each of ``rounds`` rounds, after ``warmup`` untimed calls of each. Round r runs
    the variants rotated by r (A B C, B C A, C A B, ...): each takes every position equally often, and with three or
    more none runs twice in a row across a round boundary (benchmarks/README.md, "How they measure")."""
    for _ in range(warmup):
        for call in variants.values():
            call()
    names = list(variants)
    out: dict[str, list[T]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(variants[name]())
        if between_rounds is not None:
            between_rounds(r)
    return out


def interleave(
    variants: Mapping[str, Callable[[int], Any]],
    *,
    steps_per_block: int,
    rounds: int,
    warmup: int,
    before_block: Callable[[], None] | None = None,
    between_rounds: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds per step of every (variant, round): ``run(n)`` of each for ``warmup`` steps, then
    :func:`side_by_side` blocks of ``steps_per_block``; ``before_block`` runs untimed before each (a barrier)."""

    def block(run: Callable[[int], Any]) -> Callable[[], float]:
        def timed() -> float:
            if before_block is not None:
                before_block()
            t0 = time.perf_counter()
            run(steps_per_block)
            return (time.perf_counter() - t0) / steps_per_block

        return timed

    if warmup:
        for run in variants.values():
            run(warmup)
    return side_by_side({n: block(r) for n, r in variants.items()}, rounds, between_rounds=between_rounds)


def per_call(fn: Callable[[], Any], n: int = 1) -> Callable[[], float]:
    """A variant for :func:`side_by_side`: ``n`` calls of ``fn``, its figure the seconds per call."""

    def timed() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    return timed


def blocks(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`interleave`'s blocks as ``--rounds --steps-per-block --warmup`` give them."""
    return {"steps_per_block": args.steps_per_block, "rounds": args.rounds, "warmup": args.warmup}


def slowest_rank(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per variant and block, the slowest rank's time (it sets the pace); a collective: every rank calls it."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times)
    return slowest_per_round(gathered)


def slowest_per_round(per_rank: Sequence[Mapping[str, list[float]]]) -> dict[str, list[float]]:
    """From each rank's ``{variant: [figure of each round]}``, per variant and round the largest."""
    return {n: [max(r[n][i] for r in per_rank) for i in range(len(per_rank[0][n]))] for n in per_rank[0]}


# -- processes ----------------------------------------------------------------------------------------
def ranks(nproc: int, script: str, argv: list[str], **options: Any) -> list[dict[str, Any]]:
    """``script`` on ``nproc`` ranks through ``disttrain launch`` (its own processes, as users start a job),
    each rank's result in rank order; their output echoed (``echo`` in ``options``: a filter)."""
    return launch_and_collect(nproc, Path(script), argv, **{"echo": True, **options})


@dataclass
class Ran:
    """One finished command: wall and CPU seconds (its own and its children's), its output, and why it failed
    ('' when it did not)."""

    wall_s: float
    cpu_s: float
    stdout: str
    stderr: str
    error: str


def command(
    cmd: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 900, check: bool = True
) -> Ran:
    """Run ``cmd`` as a user runs it (its own process group, this environment unless ``env``); past ``timeout``
    the whole group is killed. A failure is SystemExit with its output's tail, or with ``check=False`` the
    ``error`` of what it returns (a long benchmark goes on past one failed run)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    pipe = subprocess.PIPE
    proc = subprocess.Popen(list(cmd), env=env, cwd=ROOT, stdout=pipe, stderr=pipe, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        error = f"exit {proc.returncode}" if proc.returncode else ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        error = f"timed out after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if error and check:
        raise SystemExit(f"{' '.join(cmd[:6])} failed ({error}):\n{out[-2000:]}{err[-3000:]}")
    return Ran(wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, out, err, error)


class NotYet(RuntimeError):
    """What :func:`wait_for` waited for did not come: the process it watched ended first, or time ran out."""


def wait_for(what: str, found: Callable[[], Any], procs: Sequence[Any] = (), timeout_s: float = 240.0) -> Any:
    """Poll ``found`` (every 20 ms) until it returns something truthy, and return that; :class:`NotYet` when one of
    ``procs`` (``subprocess.Popen``) ends first (after a last look) or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := found():
            return value
        if ended := [p.returncode for p in procs if p.poll() is not None]:
            if value := found():
                return value
            raise NotYet(f"the job ended (exit {ended[0]}) while waiting for {what}")
        time.sleep(0.02)
    raise NotYet(f"timed out after {timeout_s:.0f}s waiting for {what}")


def disttrain(*args: str, root: Path, name: str, **options: Any) -> Ran:
    """``disttrain ARGS`` as a user runs it, its run folder ``root/name``; ``options``: :func:`command`'s."""
    return command([str(DISTTRAIN), *args, "--run.root", str(root), "--run.name", name], **options)


def records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (a run's ``metrics.jsonl``)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def summary(run_dir: Path) -> dict[str, Any]:
    """A finished run's ``summary.json``."""
    return dict(json.loads((run_dir / "summary.json").read_text()))


def spawn(fn: Callable[..., Any], nprocs: int, *args: Any, timeout: float = 900) -> list[Any]:
    """``fn(i, out, *args)`` in ``nprocs`` processes of its own (spawned); what each wrote to ``out/{i}.json``,
    in process order (None where nothing). Past ``timeout`` they are killed: SystemExit."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="disttrain-bench-") as tmp:
        ctx = mp.start_processes(fn, args=(tmp, *args), nprocs=nprocs, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise SystemExit(f"{fn.__name__}: not done in {timeout:.0f} s")
        return [json.loads(f.read_text()) if (f := Path(tmp) / f"{i}.json").exists() else None for i in range(nprocs)]


def run_baseline(script: str, kind: str, *args: str, timeout: float = 900) -> tuple[dict[str, Any], Ran]:
    """A baseline as its own process, as its users run it: ``python -m benchmarks.NAME --baseline KIND ARGS``;
    what it returned (its last line) and the run."""
    ran = command([sys.executable, "-m", f"benchmarks.{Path(script).stem}", "--baseline", kind, *args], timeout=timeout)
    return json.loads(ran.stdout.strip().splitlines()[-1]), ran


# -- jobs ---------------------------------------------------------------------------------------------
def job(
    model: Mapping[str, Any] | None = None, *, world: int = 1, micro_batch: int = 8, steps: int = 300, **sections: Any
) -> Any:
    """A job's config as the benchmarks run it: ``model`` (the default GPT unless given), ``micro_batch`` per
    rank on ``world`` ranks, on CPU, no evaluation or sample, the console off and ``metrics.peak_tflops`` set (no
    matmul timed at start-up); ``sections`` update their sections (``parallel``, ``precision``, ...)."""
    from disttrain.config import from_dict

    train = {"steps": steps, "global_batch": micro_batch * world, "micro_batch": micro_batch}
    cfg: dict[str, Any] = {
        "model": dict(model or {}),
        "train": {**train, "eval_interval": 0, "generate_chars": 0},
        "parallel": {"device": "cpu"},
        "metrics": {"peak_tflops": 1.0, "progress": "off"},
    }
    for section, body in sections.items():
        cfg.setdefault(section, {}).update(body)
    return from_dict(cfg)


def gpt(layers: int, width: int, heads: int, context: int) -> dict[str, int]:
    """The ``model`` section of a GPT of that shape."""
    return {"n_layers": layers, "d_model": width, "n_heads": heads, "context": context}


def gpt_of(args: argparse.Namespace) -> dict[str, int]:
    """The ``model`` section of the GPT ``--layers --width --heads --context`` give."""
    return gpt(args.layers, args.width, args.heads, args.context)


def dtype(requested: str) -> str:
    """``auto``: what ``precision.dtype = "auto"`` picks on this CPU (bf16 where bf16 matmuls are fast)."""
    from disttrain.config import PrecisionConfig
    from disttrain.parallel.env import resolve_precision

    return str(resolve_precision(PrecisionConfig(dtype=requested), "cpu").dtype)


def text(context: int) -> Any:
    """The bundled corpus in windows of ``context``."""
    from disttrain.data.text import load_text_data

    return load_text_data(None, context, 0.1)


def init_ranks() -> Any:
    """This rank's place in the launched job (gloo, one thread)."""
    from disttrain.parallel.env import init_distributed

    return init_distributed("cpu", threads=1)


def trainer(cfg: Any, data: Any, env: Any, *, model: Any = None, checkpoint: Any = None) -> Any:
    """A Trainer as a job builds it (the model on the meta device where its strategy shards it)."""
    from disttrain.build import build_model
    from disttrain.parallel.strategies import SHARDED, resolve_name
    from disttrain.train.trainer import Trainer

    if model is None:
        on_meta = resolve_name(cfg.parallel.strategy, env.world_size) in SHARDED
        model = build_model(cfg, data.tokenizer.vocab_size, on_meta=on_meta)
    return Trainer(model, data.train, cfg, env=env, checkpoint=checkpoint)


def train_steps(trainer: Any) -> Callable[[int], None]:
    """A runner for :func:`interleave`: ``n`` calls of ``trainer.train_step()``."""

    def run(n: int) -> None:
        for _ in range(n):
            trainer.train_step()

    return run


def fit_for(trainer: Any, n: int) -> Any:
    """``trainer.fit()`` for ``n`` more steps (one block): ``fit()`` runs until step ``train.steps``."""
    trainer.cfg.train.steps = trainer.step + n
    return trainer.fit()


# -- statistics and tables ----------------------------------------------------------------------------
def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of num[r] / den[r] (e.g. t_plain / t_disttrain = throughput ratio)."""
    return median([a / b for a, b in zip(num, den, strict=True)])


def spread(xs: Sequence[float]) -> tuple[float, float]:
    """(lower, upper) quartiles: how much the rounds disagree."""
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, Any]:
    """The paired ratio num / den and the quartiles of the per-round ratios, as table cells."""
    lo, hi = spread([a / b for a, b in zip(num, den, strict=True)])
    return {"ratio": paired_ratio(num, den), "IQR": f"{lo:.3f}-{hi:.3f}"}


def table(rows: Sequence[Mapping[str, Any]], title: str = "") -> None:
    """Print ``rows`` as a plain-text table: their keys are the headers, in order of first appearance; a missing
    cell is blank; numbers right-aligned."""
    headers = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_fmt(row.get(h, "")) for h in headers] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(cs: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cs, widths, strict=True)))

    lines = [title] if title else []
    print("\n".join([*lines, line(headers), "  ".join("-" * w for w in widths), *map(line, cells)]), flush=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)
