"""Start-up of a small job: what a 2-rank, 3-step tiny training costs from the command to the exit, wall and
CPU seconds, for the command a user would otherwise run (``torchrun --nproc-per-node 2`` of a plain DDP script
training a model of the same size) and for ``disttrain run`` with its CPU ranks forked from the launcher (the
default) and started as fresh interpreters (``DISTTRAIN_WORKER_START=exec``, torchrun's way).

Each round runs the three commands once, in an order that rotates every round; the figures are medians over
rounds, and the ratios are paired (the same round's times divided). The cost here is fixed per job and per
restart: imports, rendezvous, process groups; the steps themselves are milliseconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from disttrain.testing.tiny import tiny_cli_args, write_small_text
from disttrain.utils.host import cpu_name

STEPS = 3

PLAIN = (
    '''"""The loop a user writes: a 2-block transformer LM of width 64 on the text's bytes, DDP on gloo, 3 steps."""
import os, sys
import torch, torch.distributed as dist, torch.nn as nn

dist.init_process_group("gloo")
torch.manual_seed(7)
data = torch.frombuffer(bytearray(open(sys.argv[1], "rb").read()), dtype=torch.uint8).long()
layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
model = nn.Sequential(nn.Embedding(256, 64), nn.TransformerEncoder(layer, 2), nn.Linear(64, 256))
model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
mask = nn.Transformer.generate_square_subsequent_mask(32)
for step in range('''
    + str(STEPS)
    + """):
    starts = torch.randint(0, len(data) - 33, (8,))
    batch = torch.stack([data[s : s + 33] for s in starts])
    logits = model[2](model[1](model[0](batch[:, :-1]), mask=mask, is_causal=True))
    loss = nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
"""
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    return p.parse_args(argv)


def commands(tmp: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each variant's command line and environment (the user's own: no settings of ours in the baseline's)."""
    data = write_small_text(tmp / "small.txt")
    plain = tmp / "plain_ddp.py"
    plain.write_text(PLAIN)
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTTRAIN_", "MALLOC_"))}
    run = [
        str(bindir / "disttrain"),
        *tiny_cli_args(data, STEPS, "--run.root", str(tmp / "runs"), "--parallel.nproc", "2"),
    ]
    return {
        "torchrun + plain DDP": ([str(bindir / "torchrun"), "--nproc-per-node", "2", str(plain), str(data)], env),
        "disttrain run (forked ranks)": (run, env),
        "disttrain run (fresh ranks)": (run, {**env, "DISTTRAIN_WORKER_START": "exec"}),
    }


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and everything it started) of one run, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    C.print_machine()
    with tempfile.TemporaryDirectory() as d:
        variants = commands(Path(d))
        names = list(variants)
        for name in names:  # warm the page cache and the compiled bytecode once, untimed
            timed(*variants[name])
        walls: dict[str, list[float]] = {n: [] for n in names}
        cpus: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                wall, cpu = timed(*variants[name])
                walls[name].append(wall)
                cpus[name].append(cpu)
    base = names[0]
    rows = [
        [
            n,
            C.median(walls[n]),
            C.median(cpus[n]),
            C.paired_ratio(walls[n], walls[base]),
            C.paired_ratio(cpus[n], cpus[base]),
        ]
        for n in names
    ]
    title = f"a 2-rank {STEPS}-step tiny job from command to exit, {args.rounds} rounds ({cpu_name()})"
    C.table(["command", "wall s", "CPU s", "wall / torchrun", "CPU / torchrun"], rows, title)
    result: dict[str, Any] = {"rounds": args.rounds, "steps": STEPS, "wall_s": walls, "cpu_s": cpus}
    C.write_results("bench_startup", result)


if __name__ == "__main__":
    main(sys.argv[1:])
