"""Tensor parallelism without processes: the layout arithmetic, the plans, and the one-line errors for a model or
layout that does not fit (checked on meta-device models)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from disttrain.config import ParallelConfig
from disttrain.errors import ConfigError
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.parallel.clip import clip_grad_norm_
from disttrain.parallel.families import plan_for
from disttrain.parallel.strategies import dims_for, resolve_name
from disttrain.parallel.tp import check_plan, matching
from disttrain.parallel.tp_plans import hf_plan

from conftest import assert_one_line, disttrain

pytestmark = pytest.mark.timeout(60)


def _gpt(d_model: int = 64, heads: int = 4) -> GPT:
    with torch.device("meta"):
        return GPT(GPTConfig(65, n_layers=2, d_model=d_model, n_heads=heads, context=32))


def test_dims_split_the_world_into_data_groups_of_tp_adjacent_ranks() -> None:
    dims = dims_for("fsdp", 8, tp=2)
    assert (dims.dp_size, dims.replicate, dims.shard) == (4, 1, 4)
    assert [dims.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert dims.describe() == "fsdp x tp 2"
    hsdp = dims_for("hsdp", 8, local_world_size=4, tp=2)  # a node's 4 ranks: 2 data groups of tp 2
    assert (hsdp.replicate, hsdp.shard, hsdp.dp_size) == (2, 2, 4)
    assert dims_for("single", 2, tp=2).dp_size == 1
    assert resolve_name("auto", 2, tp=2) == "fsdp" and resolve_name("auto", 1, tp=2) == "single"
    assert resolve_name("auto", 2) == "ddp"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: dims_for("fsdp", 4, tp=3), "parallel.tp (3) must divide the world size (4); use one of 1, 2, 4"),
        (lambda: dims_for("ddp", 4, tp=2), "'ddp' does not compose with tensor parallelism (tp 2 x dp 2)"),
        (lambda: ParallelConfig(tp=0), "parallel.tp must be >= 1"),
    ],
)
def test_layouts_that_cannot_run_are_one_line_errors(make: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        make()
    assert "\n" not in str(e.value)


def test_the_gpt_plan_splits_whole_heads_and_names_what_does_not_divide() -> None:
    model = _gpt()
    plan = plan_for(model, "auto", loss_parallel=True)
    assert plan.vocab_sharded and len(matching(model, "blocks.*.attn.qkv")) == 2
    check_plan(model, plan, 2)  # the vocabulary (65) may split unevenly: DTensor chunks it
    with pytest.raises(ConfigError, match=r"blocks.0.attn.proj \(Linear\): in_features 64 does not divide by "):
        check_plan(model, plan, 3)
    narrow = _gpt(d_model=48, heads=3)
    with pytest.raises(ConfigError, match=r"blocks.0.attn: 3 attention heads do not divide by parallel.tp \(2\)"):
        check_plan(narrow, plan_for(narrow, "auto", True), 2)


def test_a_hugging_face_llama_brings_its_own_plan() -> None:
    transformers = pytest.importorskip("transformers")
    import hf_models

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(hf_models.llama_config())
    plan = hf_plan(model)
    assert plan is not None and "model.layers.*.self_attn.q_proj" in plan.styles
    check_plan(model, plan, 2)
    with pytest.raises(ConfigError, match=r"self_attn: num_key_value_heads 2 does not divide by parallel.tp \(4\)"):
        check_plan(model, plan, 4)


def test_hugging_face_gpt2_gets_disttrains_plan_and_names_what_does_not_divide() -> None:
    transformers = pytest.importorskip("transformers")
    import hf_models
    from disttrain.parallel.tp_gpt2 import PackedQKVColwise, qkv_order

    def gpt2(**shape: int) -> nn.Module:
        with torch.device("meta"):
            cfg = transformers.GPT2Config(**{**hf_models.gpt2_config().to_dict(), **shape})
            return transformers.GPT2LMHeadModel(cfg)

    model = gpt2()
    plan = hf_plan(model)
    assert plan is not None and isinstance(plan.styles["transformer.h.*.attn.c_attn"], PackedQKVColwise)
    assert not plan.vocab_sharded and not any("wte" in k or "lm_head" in k for k in plan.styles)  # tied: whole
    check_plan(model, plan, 2)
    check_plan(model, plan, 4)  # 4 heads of 16
    with pytest.raises(ConfigError, match=r"transformer.h.0.attn.c_proj \(Conv1D\): nx 64 does not divide by ") as e:
        check_plan(model, plan, 3)
    assert "\n" not in str(e.value)
    three = gpt2(n_embd=96, n_head=3)  # widths divide by 2, the heads do not
    with pytest.raises(ConfigError, match=r"transformer.h.0.attn: n_head 3 does not divide by parallel.tp \(2\)"):
        check_plan(three, hf_plan(three), 2)  # type: ignore[arg-type]
    # q, k, v of head 0, then of head 1: (2 heads of width 2) -> columns q0 q1 k0 k1 v0 v1 | q2 q3 k2 k3 v2 v3
    assert qkv_order(2, 12).tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]


def user_plan(model: nn.Module) -> dict[str, Any]:
    return {"blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise"}


def typo_plan(model: nn.Module) -> dict[str, Any]:
    return {"blocks.*.mlp.fc1": "colwise"}


def odd_style_plan(model: nn.Module) -> dict[str, Any]:
    return {"blocks.*.mlp.fc": "diagonal"}


def test_a_plan_of_your_own_by_import_path() -> None:
    model = _gpt()
    plan = plan_for(model, f"{__name__}:user_plan", True)
    assert sorted(plan.styles) == ["blocks.*.mlp.fc", "blocks.*.mlp.proj"] and not plan.vocab_sharded
    with pytest.raises(ConfigError, match=r"plan path 'blocks.\*.mlp.fc1' matches no module of GPT"):
        check_plan(model, plan_for(model, f"{__name__}:typo_plan", True), 2)
    with pytest.raises(ConfigError, match=r"style 'diagonal' is not one disttrain applies"):
        plan_for(model, f"{__name__}:odd_style_plan", True)
    with pytest.raises(ConfigError, match="no tensor-parallel plan for Linear"):
        plan_for(nn.Linear(2, 2), "auto", True)


def test_the_grouped_norm_of_plain_tensors_is_torchs() -> None:
    torch.manual_seed(0)
    a, b = (nn.Linear(8, 8) for _ in range(2))
    for p in [*a.parameters(), *b.parameters()]:
        p.grad = torch.randn_like(p)
    b.load_state_dict(a.state_dict())
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.grad is not None
        pb.grad = pa.grad.clone()
    mine = clip_grad_norm_(a.parameters(), 0.5)
    theirs = torch.nn.utils.clip_grad_norm_(list(b.parameters()), 0.5)
    assert mine == pytest.approx(float(theirs), rel=1e-6)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tp_that_does_not_fit_is_one_line_before_any_worker(tmp_path: Any, small_text: Any) -> None:
    common = ["run", "--data.path", str(small_text), "--parallel.device", "cpu", "--parallel.nproc", "2"]
    proc = disttrain(*common, "--parallel.tp", "3", cwd=tmp_path)
    assert_one_line(proc, "parallel.tp (3) must divide the world size (2)")
    proc = disttrain(*common, "--parallel.tp", "2", "--model.n-heads", "3", "--model.d-model", "48", cwd=tmp_path)
    assert_one_line(proc, "blocks.0.attn: 3 attention heads do not divide by parallel.tp (2)")
