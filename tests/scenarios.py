"""Multi-process scenarios for the test suite, run under `disttrain launch -n N scenarios.py NAME OUT SPEC`.

Each rank runs every variant in SPEC (a JSON list of {name, config}) inside one process group and
writes its results to OUT/NAME.rank<r>.json; the pytest side compares them with a single-process
reference. One launch per scenario keeps the suite fast (imports cost ~2 s per process here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from disttrain.build import build_model
from disttrain.checkpoint import CheckpointManager
from disttrain.config import from_dict
from disttrain.data.loader import collate
from disttrain.data.text import load_text_data
from disttrain.dist.env import destroy_distributed, init_distributed
from disttrain.dist.fsdp import find_blocks
from disttrain.dist.mesh import resolve_strategy
from disttrain.train.trainer import Trainer


def fsdp_schedule(model: torch.nn.Module) -> dict[str, Any]:
    """How many blocks each block prefetches, and its reshard flag, as FSDP2 recorded them."""
    out = []
    for b in find_blocks(model):
        state = b._get_fsdp_state()  # type: ignore[operator]
        group = state._fsdp_param_group
        out.append(
            {
                "fwd": len(state._states_to_forward_prefetch),
                "bwd": len(state._states_to_backward_prefetch),
                "reshard": bool(group.post_forward_mesh_info is not None) if group else None,
            }
        )
    return {"blocks": out}


def sync_check(trainer: Trainer) -> dict[str, Any]:
    """After a non-final micro-step no gradient is reduced; after the final one every rank agrees."""
    model = trainer.model
    micro = trainer.loader.next_step()
    observed = []
    for i, batch in enumerate(micro):
        x, y = trainer._to_device(batch)
        last = i == len(micro) - 1
        with model.sync(last):
            with model.autocast():
                out = model(x)
            (trainer.loss_fn(out, y) / len(micro)).backward()
        p = next(model.parameters())
        if trainer.dims.fsdp_enabled:
            # FSDP2 keeps unsynced grads in its unsharded buffers; the sharded .grad appears only after sync.
            observed.append({"grad_present": p.grad is not None})
        else:
            g = p.grad.detach().flatten()[:64].clone()
            gathered = [torch.zeros_like(g) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, g)
            observed.append({"ranks_agree": all(torch.equal(gathered[0], t) for t in gathered)})
    trainer.optimizer.zero_grad(set_to_none=True)
    return {"micro_steps": observed}


@torch.no_grad()
def fixed_batch_loss(trainer: Trainer, batch: Any) -> float:
    """The same 8 windows on every rank (every rank takes part: FSDP gathers parameters)."""
    x, y = trainer._to_device(batch)
    with trainer.model.autocast():
        return float(trainer.loss_fn(trainer.model(x), y))


def probe(trainer: Trainer, fixed: Any) -> dict[str, Any]:
    """What a checkpoint must carry over: model outputs on fixed batches, Adam moments and step, data position."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    _, osd = get_state_dict(trainer.model.module, trainer.optimizer, options=StateDictOptions(full_state_dict=True))
    digest = {
        f"{fqn}.{k}": float(v.double().sum()) if v.dim() else float(v)
        for fqn, st in osd["state"].items()
        for k, v in st.items()
    }
    return {
        "step": trainer.step,
        "position": trainer.loader.position,
        "fixed_loss": fixed_batch_loss(trainer, fixed),
        "optim": digest,
        "lr": trainer.optimizer.param_groups[0]["lr"],
    }


def run_variant(spec: dict[str, Any], env: Any) -> dict[str, Any]:
    cfg = from_dict(spec["config"])
    torch.manual_seed(cfg.train.seed)
    text = load_text_data(cfg.data.path, cfg.model.context, cfg.data.val_fraction)
    strategy = resolve_strategy(cfg.parallel.strategy, env.world_size)
    model = build_model(cfg, text.tokenizer.vocab_size, on_meta=strategy in ("fsdp", "hsdp"))
    fixed = collate([text.val[i * 97] for i in range(8)])
    ckpt = None
    if "ckpt_folder" in spec:
        ckpt = CheckpointManager(spec["ckpt_folder"], cfg.checkpoint, rank=env.rank, world_size=env.world_size,
                                 strategy=strategy)  # fmt: skip
    trainer = Trainer(model, text.train, cfg, val_data=text.val, env=env, checkpoint=ckpt)
    out: dict[str, Any] = {"strategy": trainer.dims.strategy, "accum": trainer.plan.accum_steps}
    if spec.get("probe") == "after_resume":
        trainer.resume()
        out["probe"] = probe(trainer, fixed)
    if spec.get("check") == "sync":
        out.update(sync_check(trainer))
        return out
    if trainer.dims.fsdp_enabled:
        out["schedule"] = fsdp_schedule(trainer.model.module)
    if "nan_at" in spec:  # {"rank": r, "call": k}: the k-th loss on rank r is NaN
        poison, calls, inner = spec["nan_at"], [0], trainer.loss_fn

        def poisoned(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            loss = inner(logits, targets)
            return loss * float("nan") if env.rank == poison["rank"] and calls[0] == poison["call"] else loss

        trainer.loss_fn = poisoned
    res = trainer.fit()
    if spec.get("probe") == "after_fit":
        out["probe"] = probe(trainer, fixed)
    out.update(
        start_step=res.start_step,
        losses=res.losses,
        grad_norms=res.grad_norms,
        val=res.val_losses,
        skipped=res.skipped_steps,
    )
    out["tokens_per_s"] = res.tokens_per_s
    return out


def main() -> None:
    name, out_dir, spec_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    specs = json.loads(spec_path.read_text())
    env = init_distributed("cpu", timeout_s=60, threads=1)
    results = {s["name"]: run_variant(s, env) for s in specs}
    (out_dir / f"{name}.rank{env.rank}.json").write_text(json.dumps(results))
    destroy_distributed()


if __name__ == "__main__":
    main()
