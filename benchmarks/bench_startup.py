"""Start-up of a small job: a 2-rank, 3-step tiny training from the command to the exit, wall and CPU seconds:
``torchrun --nproc-per-node 2`` of a plain DDP script (:data:`PLAIN`) against ``disttrain run`` with its CPU ranks
forked from the launcher (the default) and started fresh (``DISTTRAIN_WORKER_START=exec``): the fixed cost per job
and restart (imports, rendezvous, process groups).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness as H
from disttrain.testing.tiny import tiny_cli_args, write_small_text

STEPS = 3
OPTIONS = {
    **H.options(rounds=5, warmup=1),  # warmup: runs (page cache, bytecode)
}
QUICK = {"rounds": 1, "warmup": 0}

PLAIN = f"""# The loop a user writes: a 2-block transformer LM of width 64 on the text's bytes, DDP on gloo, 3 steps.
import sys
import torch, torch.distributed as dist, torch.nn as nn

dist.init_process_group("gloo")
torch.manual_seed(7)
data = torch.frombuffer(bytearray(open(sys.argv[1], "rb").read()), dtype=torch.uint8).long()
mask = nn.Transformer.generate_square_subsequent_mask(32)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(256, 64), nn.Linear(64, 256)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True), 2)

    def forward(self, x):
        return self.head(self.body(self.emb(x), mask=mask, is_causal=True))


model = nn.parallel.DistributedDataParallel(LM())
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range({STEPS}):
    starts = torch.randint(0, len(data) - 33, (8,))
    batch = torch.stack([data[s : s + 33] for s in starts])
    loss = nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, 256), batch[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print(f"step {{step + 1}} loss {{loss.item():.4f}}", flush=True)
dist.destroy_process_group()
"""


def commands(tmp: Path) -> dict[str, Any]:
    """Each variant as a call that runs its command (the user's own environment: no settings of ours in the
    baseline's)."""
    data = write_small_text(tmp / "small.txt")
    plain = tmp / "plain_ddp.py"
    plain.write_text(PLAIN)
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTTRAIN_", "MALLOC_"))}
    run = [
        str(bindir / "disttrain"),
        *tiny_cli_args(data, STEPS, "--run.root", str(tmp / "runs"), "--parallel.nproc", "2"),
    ]
    torchrun = [str(bindir / "torchrun"), "--nproc-per-node", "2", str(plain), str(data)]
    return {
        "torchrun + plain DDP": lambda: H.command(torchrun, env=env),
        "disttrain run (forked ranks)": lambda: H.command(run, env=env),
        "disttrain run (fresh ranks)": lambda: H.command(run, env={**env, "DISTTRAIN_WORKER_START": "exec"}),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        runs = H.side_by_side(commands(Path(d)), args.rounds, warmup=args.warmup)
    walls = {n: [r.wall_s for r in rs] for n, rs in runs.items()}
    cpus = {n: [r.cpu_s for r in rs] for n, rs in runs.items()}
    base = next(iter(runs))
    rows = [
        {
            "command": n,
            "wall s": H.median(walls[n]),
            "CPU s": H.median(cpus[n]),
            "wall / torchrun": H.paired_ratio(walls[n], walls[base]),
            "CPU / torchrun": H.paired_ratio(cpus[n], cpus[base]),
        }
        for n in runs
    ]
    H.table(rows, f"a 2-rank {STEPS}-step tiny job from command to exit, {args.rounds} rounds")
    return {"steps": STEPS, "rows": rows, "wall_s_per_round": walls, "cpu_s_per_round": cpus}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
