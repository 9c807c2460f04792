"""The model summary of `disttrain run`'s opening lines: counts per module, bytes per dtype, sharding units."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from disttrain.config import ParallelConfig
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.parallel.env import destroy_distributed
from disttrain.parallel.parallelize import parallelize
from disttrain.parallel.strategies import dims_for
from disttrain.train.summary import ROOT, ModelSummary, ModuleRow, ShardUnit, model_summary, render, summarize

pytestmark = pytest.mark.timeout(120)
TINY = GPTConfig(vocab_size=50, n_layers=3, d_model=32, n_heads=4, context=16)


class Mixed(nn.Module):
    """Tied weights, a frozen layer, a bf16 layer, a parameter of the root itself, a parameter-less child."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.emb = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied: counted once, under emb
        self.body[0].requires_grad_(False)
        self.body[2].to(torch.bfloat16)


def test_totals_rows_and_bytes_per_dtype() -> None:
    model = Mixed()
    s = summarize(model)
    total = sum(p.numel() for p in model.parameters())
    assert s.total == total == 3 + 40 + (32 + 8) + (32 + 4)
    assert sum(r.params for r in s.rows) == total
    assert s.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad) == total - 40
    assert {r.name: r.params for r in s.rows} == {"emb": 40, "body": 76, ROOT: 3}  # no head (tied), no drop
    assert {r.name: r.cls for r in s.rows} == {"emb": "Embedding", "body": "Sequential", ROOT: "Mixed"}
    assert s.bytes_by_dtype == {"float32": (3 + 40 + 40) * 4, "bfloat16": 36 * 2}
    assert s.units == []
    text = render(s)
    assert re.search(rf"^  total +Mixed +{total} +{total - 40} +100\.0%$", text, re.M), text
    assert re.search(r"^  body +Sequential +76 +36 +63\.9%$", text, re.M), text
    assert "float32 332 B, bfloat16 72 B" in text.splitlines()[0]
    assert text.endswith("sharding units: none (the one rank holds every parameter)")
    assert model_summary(model, 4).endswith("(each of 4 ranks holds every parameter)")


def test_meta_model_and_ddp_wrapper_count_like_the_real_one() -> None:
    real = GPT(TINY)
    with torch.device("meta"):
        meta = GPT(TINY)
    assert summarize(meta) == summarize(real)
    s = summarize(real)
    assert s.total == sum(p.numel() for p in real.parameters())
    assert [r.name for r in s.rows] == ["tok_emb", "pos_emb", "blocks", "ln_f", "head"]
    assert s.bytes_by_dtype == {"float32": 4 * s.total}


def test_fit_prints_the_summary_and_tokens_per_step(tiny_trainer: Callable[..., Any], capsys) -> None:
    trainer = tiny_trainer(train={"steps": 1}, metrics={"progress": "lines"})
    trainer.fit()
    out = capsys.readouterr().out
    n = sum(p.numel() for p in trainer.model.parameters())
    assert "global batch 8 = micro 8 x accum 1 x dp 1 (256 tokens/step)" in out  # 8 samples x context 32
    assert f"model GPT: {n:,} parameters ({n:,} trainable), float32 " in out
    assert re.search(rf"^  total +GPT +{n:,} +{n:,} +100\.0%$", out, re.M), out
    assert "sharding units: none (the one rank holds every parameter)" in out


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """FSDP on one rank makes an in-process gloo group (no port); leave none behind for other tests."""
    assert not dist.is_initialized()
    yield
    destroy_distributed()


def test_fsdp_units_on_one_rank(one_rank_group: None) -> None:
    model = GPT(TINY)
    whole = summarize(model)
    parallelize(model, ParallelConfig(strategy="fsdp"), dims=dims_for("fsdp", 1), device=torch.device("cpu"))
    assert all(isinstance(p, DTensor) for p in model.parameters())
    s = summarize(model)
    n = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the global size
    assert s.total == n == whole.total and s.rows == whole.rows and s.bytes_by_dtype == whole.bytes_by_dtype
    names = ["blocks.0", "blocks.1", "blocks.2", ROOT]
    assert [(u.name, u.cls, u.ranks, u.replicas) for u in s.units] == [
        *[(b, "Block", 1, 1) for b in names[:3]],
        (ROOT, "GPT", 1, 1),
    ]
    block = sum(p.numel() for p in model.blocks[0].parameters())
    assert [u.params for u in s.units] == [block, block, block, n - 3 * block]
    assert [u.nbytes for u in s.units] == [4 * u.params for u in s.units]
    text = model_summary(model)
    assert "sharding units (fully_shard): 4" in text
    assert re.search(rf"^  blocks\.0\.\.2 +3 x Block +{block:,} each +1 rank ", text, re.M), text
    assert re.search(rf"^  \(root\) +GPT +{n - 3 * block:,} +1 rank ", text, re.M), text


def test_blocks_sharded_together_are_one_unit(one_rank_group: None) -> None:
    """`6 block(s) per FSDP unit` was followed by a list of 7 units, one block each: one truth."""
    model = GPT(TINY)
    parallel = ParallelConfig(strategy="fsdp", blocks_per_unit=3)
    parallelize(model, parallel, dims=dims_for("fsdp", 1), device=torch.device("cpu"))
    s = summarize(model)
    assert [(u.name, u.cls, u.members) for u in s.units] == [
        ("blocks.0..2", "3 x Block, one unit", ["blocks.0", "blocks.1", "blocks.2"]),
        (ROOT, "GPT", [ROOT]),
    ]
    block = sum(p.numel() for p in model.blocks[0].parameters())
    assert s.units[0].params == 3 * block
    text = model_summary(model)
    assert "sharding units (fully_shard): 2" in text
    assert re.search(rf"^  blocks\.0\.\.2 +3 x Block, one unit +{3 * block:,} +1 rank ", text, re.M), text


def test_units_render_grouped_with_their_split() -> None:
    rows = [ModuleRow("blocks", "ModuleList", 400, 400), ModuleRow("head", "Linear", 100, 100)]
    units = [ShardUnit(f"blocks.{i}", "Block", 100, 400, ranks=4, replicas=2) for i in range(4)]
    units.append(ShardUnit(ROOT, "Net", 100, 400, ranks=4, replicas=2))
    text = render(ModelSummary("Net", rows, 500, 500, {"float32": 2000}, units, world_size=8))
    assert "sharding units (fully_shard): 5" in text
    assert re.search(r"^  blocks\.0\.\.3 +4 x Block +100 each +4 ranks x 2 replicas +100 B each$", text, re.M), text
    assert re.search(r"^  \(root\) +Net +100 +4 ranks x 2 replicas +100 B$", text, re.M), text
