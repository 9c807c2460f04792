"""The strategy registry: one object per strategy, the plan's columns, and the layout each one resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.strategies import dims_for, dims_of, for_dims


def test_every_name_has_one_object_and_an_unknown_name_lists_them() -> None:
    assert strategies.NAMES == ("single", "ddp", "fsdp", "hsdp")
    assert strategies.SHARDED == ("fsdp", "hsdp")
    assert all(strategies.get(n).name == n for n in strategies.NAMES)
    with pytest.raises(ConfigError, match=r"one of \('single', 'ddp', 'fsdp', 'hsdp'\).*got 'zero3'"):
        strategies.get("zero3")
    assert strategies.resolve_name("auto", 1) == "single" and strategies.resolve_name("auto", 4) == "ddp"


def test_each_strategy_resolves_its_own_degrees() -> None:
    assert (dims_for("ddp", 4).replicate, dims_for("ddp", 4).shard) == (4, 1)
    assert (dims_for("fsdp", 4).replicate, dims_for("fsdp", 4).shard) == (1, 4)
    hsdp = dims_for("hsdp", 8, local_world_size=4)
    assert (hsdp.replicate, hsdp.shard) == (2, 4) and hsdp.describe() == "hsdp (2 replicas x 4 shards)"
    assert dims_for("fsdp", 4, replicate=2).strategy == "hsdp"  # fsdp with replica groups is HSDP
    with pytest.raises(ConfigError, match="strategy 'single' runs one process"):
        dims_for("single", 2)
    with pytest.raises(ConfigError, match=r"parallel.shard \(3\) must divide the world size \(8\)"):
        dims_for("hsdp", 8, shard=3)
    assert for_dims(dims_for("fsdp", 2)) is strategies.STRATEGIES["fsdp"]


def test_the_plan_columns_are_strategies_with_options() -> None:
    cols = strategies.COLUMNS
    assert list(cols) == ["ddp", "fsdp", "fsdp_no_reshard", "hsdp", "fsdp_offload"]
    assert [k for k, c in cols.items() if c.sharded] == list(strategies.SHARDED_COLUMNS)
    assert cols["fsdp_no_reshard"].strategy is cols["fsdp"].strategy and not cols["fsdp_no_reshard"].reshard
    assert cols["hsdp"].shard_degree(4, 2) == 4 and cols["fsdp"].shard_degree(4, 2) == 8
    assert cols["ddp"].shard_degree(4, 2) == 1
    assert not cols["hsdp"].distinct_at(4, 1) and cols["hsdp"].distinct_at(4, 2) and cols["fsdp"].distinct_at(4, 1)
    assert strategies.column_for("single", "default", False).key == "ddp"
    assert strategies.column_for("fsdp", "never", False).key == "fsdp_no_reshard"
    assert strategies.column_for("hsdp", "default", True).key == "fsdp_offload"


def test_autocast_only_where_the_wrapper_does_not_cast_parameters() -> None:
    ddp, fsdp = strategies.get("ddp"), strategies.get("fsdp")
    assert isinstance(ddp.autocast("cpu", "bf16"), torch.autocast)
    assert not isinstance(ddp.autocast("cpu", "fp32"), torch.autocast)
    assert not isinstance(fsdp.autocast("cpu", "bf16"), torch.autocast)  # FSDP's policy casts parameters


def test_the_global_norm_of_a_plain_model() -> None:
    model = torch.nn.Linear(3, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0, 0.0]])
    assert strategies.get("single").clip_grad_norm_(model, 0) == pytest.approx(5.0)
    assert strategies.get("single").clip_grad_norm_(model, 1.0) == pytest.approx(5.0)
    assert torch.linalg.vector_norm(model.weight.grad) == pytest.approx(1.0, rel=1e-4)


def test_a_resolved_job_changes_only_for_an_elastic_membership(tmp_path: Path) -> None:
    from disttrain.config import JobConfig, ResolvedJob, TrainConfig, resolve_batch, to_dict

    cfg = JobConfig(train=TrainConfig(global_batch=64, micro_batch=8))
    job = ResolvedJob(cfg, "cpu", 2, 2, "hsdp", 2, 2, resolve_batch(cfg.train, 4), reason="auto: ...", auto=True)
    assert job.at_world(4, 2) is job  # as planned: nothing re-derived
    alone = job.at_world(2, 2)  # one node of the two left
    assert (alone.nnodes, alone.nproc, alone.world_size) == (1, 2, 2)
    assert alone.batch.accum_steps == 2 * job.batch.accum_steps and alone.batch.global_batch == job.batch.global_batch
    assert (dims_of(alone).replicate, dims_of(alone).shard) == (1, 2)
    assert to_dict(ResolvedJob.from_json(job.to_json()).config) == to_dict(cfg)
    with pytest.raises(ConfigError, match=r"has no resolved\.json"):
        ResolvedJob.read(tmp_path)
