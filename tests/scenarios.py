"""Multi-process scenarios for the test suite, run under `disttrain launch -n N scenarios.py SPEC --out OUT`
(:func:`disttrain.testing.launch.launch_and_collect`).

Each rank runs every variant in SPEC (a JSON list of {name, config}) inside one process group and
writes its results to OUT/rank<r>.json; the pytest side compares them with a single-process
reference. One launch per scenario keeps the suite fast (imports cost ~2 s per process here).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from disttrain.build import build_for_training
from disttrain.checkpoint import CheckpointManager
from disttrain.config import from_dict
from disttrain.data.loader import collate, to_device
from disttrain.data.text import load_text_data
from disttrain.models.outputs import logits_of
from disttrain.parallel.env import destroy_distributed, init_distributed
from disttrain.parallel.fsdp import find_blocks
from disttrain.parallel.strategies import resolve_name
from disttrain.testing.launch import write_rank_result
from disttrain.train.trainer import Trainer


def fsdp_schedule(model: torch.nn.Module) -> dict[str, Any]:
    """How many blocks each block prefetches, and its reshard flag, as FSDP2 recorded them; how many FSDP units
    hold parameters."""
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
    groups = {
        id(m._get_fsdp_state()._fsdp_param_group)
        for m in model.modules()  # type: ignore[operator]
        if hasattr(m, "_get_fsdp_state") and m._get_fsdp_state()._fsdp_param_group is not None
    }
    return {"blocks": out, "units": len(groups)}


def tp_facts(trainer: Trainer) -> dict[str, Any]:
    """Where tensor parallelism left the model: how many parameters are split over the TP mesh, this rank's data
    group, and whether the logits stay sharded over the vocabulary (loss parallel)."""
    split = [
        n
        for n, p in trainer.model.module.named_parameters()
        if isinstance(p, DTensor) and "tp" in (p.device_mesh.mesh_dim_names or ())
    ]
    return {
        "split": len(split),
        "params": len(list(trainer.model.module.parameters())),
        "dp_rank": trainer.loader.dp_rank,
        "vocab_parallel": trainer.model.vocab_parallel,
    }


def sync_check(trainer: Trainer) -> dict[str, Any]:
    """After a non-final micro-step no gradient is reduced; after the final one every rank agrees."""
    model = trainer.model
    micro = trainer.loader.next_step()
    observed: list[dict[str, bool]] = []

    def look(i: int) -> None:
        p = next(model.parameters())
        if trainer.dims.fsdp_enabled:
            # FSDP2 keeps unsynced grads in its unsharded buffers; the sharded .grad appears only after sync.
            observed.append({"grad_present": p.grad is not None})
        else:
            g = p.grad.detach().flatten()[:64].clone()
            gathered = [torch.zeros_like(g) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, g)
            observed.append({"ranks_agree": all(torch.equal(gathered[0], t) for t in gathered)})

    trainer.forward_backward(micro, after_backward=look)
    trainer.optimizer.zero_grad(set_to_none=True)
    return {"micro_steps": observed}


@torch.no_grad()
def fixed_batch_loss(trainer: Trainer, batch: Any) -> float:
    """The same 8 windows on every rank (every rank takes part: FSDP gathers parameters)."""
    x, y = to_device(batch, trainer.env.device)
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


@torch.no_grad()
def inspect_model(trainer: Trainer, fixed: Any) -> dict[str, Any]:
    """A model the project did not write: its logits on the fixed batch (a digest), and whether its tied
    embedding and head are still one tensor (the same parameter, equal once gathered)."""
    x, _ = to_device(fixed, trainer.env.device)
    logits = logits_of(trainer.model(x)).float()
    params = dict(trainer.model.inner.named_parameters(remove_duplicate=False))
    emb = next((p for n, p in params.items() if n.endswith(("wte.weight", "embed_tokens.weight"))), None)
    head = next((p for n, p in params.items() if n.endswith("lm_head.weight")), None)
    tied = None
    if emb is not None and head is not None:
        full = [t.full_tensor() if isinstance(t, DTensor) else t for t in (emb, head)]
        tied = emb is head and torch.equal(full[0], full[1])
    return {"logits_sum": float(logits.double().sum()), "logits_head": logits[:2, :3, :4].tolist(), "tied": tied}


def saved_for_backward(trainer: Trainer, batch: Any) -> dict[str, int]:
    """Tensors (and their bytes) that one forward of ``batch`` keeps for backward; backward then runs as usual."""
    seen = {"tensors": 0, "bytes": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen["tensors"] += 1
        seen["bytes"] += t.numel() * t.element_size()
        return t

    x, y = to_device(batch, trainer.env.device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), trainer.model.autocast():
        loss = trainer.loss_fn(trainer.model(x), y)
    loss.backward()  # every rank: FSDP and DDP finish their collectives; the model is left as fit() left it
    return seen


def offload_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Where FSDP2 keeps the shards: each unit's offload policy, each parameter's flags, and the devices."""
    groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule)]
    params = [fp for g in groups if g is not None for fp in g.fsdp_params]
    shards = [p.to_local() for p in model.parameters()]
    state = [t for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
    return {
        "policies": [type(g.offload_policy).__name__ for g in groups if g is not None],
        "to_cpu": [fp.offload_to_cpu for fp in params],
        "pin_memory": [fp.pin_memory for fp in params],
        "pinned": [t.is_pinned() for t in shards],
        "param_devices": sorted({t.device.type for t in shards}),
        "grad_devices": sorted({p.grad.device.type for p in model.parameters() if p.grad is not None}),
        "optim_devices": sorted({t.device.type for t in state}),
        "optim_tensors": len(state),
    }


def probe_applied(trainer: Trainer, batch: Any) -> dict[str, Any]:
    """Whether activation checkpointing and CPU offload are in place, not only configured (run after fit)."""
    model = trainer.model.module
    out: dict[str, Any] = {
        "checkpointed": [bool(st and st.enable_hook) for st in map(checkpoint.state, find_blocks(model))],
        "saved": saved_for_backward(trainer, batch),
    }
    if trainer.dims.fsdp_enabled:
        out["offload"] = offload_state(model, trainer.optimizer)
    trainer.optimizer.zero_grad(set_to_none=True)
    return out


def poison_loss(trainer: Trainer, poison: dict[str, int], rank: int) -> None:
    """The ``poison["call"]``-th loss on rank ``poison["rank"]`` is NaN."""
    calls, inner = [0], trainer.loss_fn

    def poisoned(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        loss = inner(logits, targets)
        return loss * float("nan") if rank == poison["rank"] and calls[0] == poison["call"] else loss

    trainer.loss_fn = poisoned


def after_fit(spec: dict[str, Any], trainer: Trainer, fixed: Any) -> dict[str, Any]:
    """What the spec asks to look at once training is done."""
    out: dict[str, Any] = {}
    if spec.get("inspect") == "after_fit":
        out["inspect"] = inspect_model(trainer, fixed)
    if spec.get("probe") == "after_fit":
        out["probe"] = probe(trainer, fixed)
    if spec.get("probe_applied"):
        out["applied"] = probe_applied(trainer, fixed)
    return out


def run_variant(spec: dict[str, Any], env: Any) -> dict[str, Any]:
    cfg = from_dict(spec["config"])
    torch.manual_seed(cfg.train.seed)
    text = load_text_data(cfg.data.path, cfg.model.context, cfg.data.val_fraction)
    strategy = resolve_name(cfg.parallel.strategy, env.world_size // cfg.parallel.tp, cfg.parallel.tp)
    model = build_for_training(cfg, text.tokenizer.vocab_size, strategy in ("fsdp", "hsdp"))
    fixed = collate([text.val[i * 97] for i in range(8)])
    ckpt = None
    if "ckpt_folder" in spec:
        ckpt = CheckpointManager(
            spec["ckpt_folder"], cfg.checkpoint, rank=env.rank, world_size=env.world_size, strategy=strategy
        )
    trainer = Trainer(model, text.train, cfg, val_data=text.val, env=env, checkpoint=ckpt)
    out: dict[str, Any] = {"strategy": trainer.dims.strategy, "accum": trainer.plan.accum_steps}
    if trainer.dims.tp > 1:
        out["tp"] = tp_facts(trainer)
    if spec.get("probe") == "after_resume":
        trainer.resume()
        out["probe"] = probe(trainer, fixed)
    if spec.get("check") == "sync":
        out.update(sync_check(trainer))
        return out
    if trainer.dims.fsdp_enabled:
        out["schedule"] = fsdp_schedule(trainer.model.module)
    if "nan_at" in spec:  # {"rank": r, "call": k}: the k-th loss on rank r is NaN
        poison_loss(trainer, spec["nan_at"], env.rank)
    if spec.get("inspect") == "before_fit":
        out["inspect"] = inspect_model(trainer, fixed)
    res = trainer.fit()
    out.update(after_fit(spec, trainer, fixed))
    out.update(
        start_step=res.start_step,
        losses=res.losses,
        grad_norms=res.grad_norms,
        val=res.val_losses,
        skipped=res.skipped_steps,
    )
    out["tokens_per_s"] = res.tokens_per_s
    if cfg.parallel.compile != "off":
        from torch._dynamo.utils import counters

        out["compiled_graphs"] = counters["stats"]["unique_graphs"]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("spec", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    specs = json.loads(args.spec.read_text())
    env = init_distributed("cpu", timeout_s=60, threads=1)
    results = {s["name"]: run_variant(s, env) for s in specs}
    write_rank_result(args.out, env.rank, results)
    destroy_distributed()


def entry(argv: list[str]) -> int:
    """A rank forked by ``disttrain launch -m`` (see disttrain.launch.forked): ``main`` reads ``sys.argv``."""
    main()
    return 0


if __name__ == "__main__":
    main()
