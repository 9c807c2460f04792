"""Tensor parallelism in the plan: split parameters, memory per rank and TP's bytes per step against figures
worked by hand for a tiny GPT, and `disttrain estimate --parallel.tp 2` printing them. Pure arithmetic on the
meta device (the CLI test is one process)."""

from __future__ import annotations

import json

import pytest
import torch

from disttrain.config import from_dict
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.parallel.tp_plans import gpt_plan
from disttrain.plan.estimate import GiB, Layout, estimate
from disttrain.plan.profile import ModelProfile, ParamInfo, profile_model
from disttrain.plan.tp import TPOption, local_profile, mark_split, split_dims, tp_collectives, tp_degrees, tp_pick
from disttrain.train.loss import cross_entropy

from conftest import disttrain

pytestmark = pytest.mark.timeout(120)

# vocabulary 65 (odd: the embeddings and the head split unevenly, 33 + 32 rows), width 32, 2 blocks, context 32
CFG = GPTConfig(65, n_layers=2, d_model=32, n_heads=2, context=32)
MICRO, SEQ = 4, 32


def tiny_gpt() -> GPT:
    with torch.device("meta"):
        return GPT(CFG)


def tiny_profile(sequence_parallel: bool = True) -> ModelProfile:
    model = tiny_gpt()
    sample = (torch.zeros(SEQ, dtype=torch.long), torch.zeros(SEQ, dtype=torch.long))
    prof = profile_model(model, sample, micro_batch=MICRO, loss_fn=cross_entropy, compute_dtype="fp32")
    return mark_split(prof, split_dims(model, gpt_plan(model, True, sequence_parallel).styles))


def fp32_cfg(**parallel: object) -> object:
    return from_dict(
        {
            "precision": {"dtype": "fp32"},
            "train": {"global_batch": 8, "micro_batch": MICRO},
            "parallel": {"device": "cpu", **parallel},
        }
    )


def test_the_gpt_plan_splits_weights_in_the_documented_dimensions() -> None:
    dims = split_dims(tiny_gpt(), gpt_plan(tiny_gpt(), True).styles)
    assert dims["blocks.0.attn.qkv.weight"] == 0 and dims["blocks.0.attn.qkv.bias"] == 0  # colwise: dim 0
    assert dims["blocks.1.mlp.fc.weight"] == 0 and dims["blocks.1.mlp.fc.bias"] == 0
    assert dims["blocks.0.attn.proj.weight"] == 1 and dims["blocks.1.mlp.proj.weight"] == 1  # rowwise: dim 1
    assert "blocks.0.attn.proj.bias" not in dims  # added after the reduction: replicated
    assert dims["tok_emb.weight"] == 0 and dims["pos_emb.weight"] == 0  # embedding rowwise: dim 0
    assert dims["head.weight"] == 0
    assert not any(".ln" in n or n.startswith("ln_f") for n in dims)  # norms: whole on every rank


def test_gpt2s_conv1d_layers_split_in_the_transposed_dimensions() -> None:
    transformers = pytest.importorskip("transformers")
    import hf_models
    from disttrain.parallel.tp_plans import hf_plan

    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(hf_models.gpt2_config())
    plan = hf_plan(model)
    assert plan is not None
    dims = split_dims(model, plan.styles)
    h = "transformer.h.0"
    assert dims[f"{h}.attn.c_attn.weight"] == 1 and dims[f"{h}.attn.c_attn.bias"] == 0  # Conv1D (in, out): out
    assert dims[f"{h}.mlp.c_fc.weight"] == 1 and dims[f"{h}.mlp.c_fc.bias"] == 0
    assert dims[f"{h}.attn.c_proj.weight"] == 0 and dims[f"{h}.mlp.c_proj.weight"] == 0  # row-wise: in
    assert f"{h}.attn.c_proj.bias" not in dims and not any("wte" in n or "ln_" in n for n in dims)


# Elements one rank holds at tp 2, by hand (V = 65, d = 32, 2 blocks):
#   tok_emb 65 x 32 -> 33 rows x 32 = 1056; pos_emb 32 x 32 -> 16 x 32 = 512; head 65 x 32 -> 33 x 32 = 1056
#   a block: ln1 + ln2 4 x 32 = 128 whole; qkv 96 x 32 -> 48 x 32 = 1536, bias 48; attn.proj 32 x 32 -> 32 x 16 =
#   512, bias 32 whole; fc 128 x 32 -> 64 x 32 = 2048, bias 64; mlp.proj 32 x 128 -> 32 x 64 = 2048, bias 32
#   -> 6448 per block; ln_f 64                    -> 1056 + 512 + 2 x 6448 + 64 + 1056 = 15584 (of 30656)
# FSDP over 2 data-parallel ranks then shards dim 0 of each local tensor (padded):
#   tok_emb 17 x 32 = 544; pos_emb 8 x 32 = 256; head 544; ln_f 32
#   a block: norms 64; qkv 24 x 32 = 768 + 24; attn.proj 16 x 16 = 256 + 16; fc 32 x 32 = 1024 + 32;
#   mlp.proj 16 x 64 = 1024 + 16 -> 3224     -> 544 + 256 + 2 x 3224 + 32 + 544 = 7824
TP2_ELEMENTS, TP2_FSDP2_ELEMENTS, FULL_ELEMENTS = 15584, 7824, 30656


def test_memory_per_rank_at_tp2_matches_hand_computed_bytes() -> None:
    prof = tiny_profile()
    assert prof.n_params == FULL_ELEMENTS
    local = local_profile(prof, 2, sequence_parallel=True, loss_parallel=True)
    qkv = next(p for p in local.params if p.name == "blocks.0.attn.qkv.weight")
    assert qkv.shape == (48, 32)  # 3 x d_model rows split in dim 0
    assert local.n_params == TP2_ELEMENTS
    est = estimate(prof, fp32_cfg(), Layout(4, 1, 64 * GiB, tp=2))  # 2 data-parallel groups of tp 2
    ddp, fsdp = est.plans["ddp"], est.plans["fsdp"]
    assert (ddp.params, ddp.grads, ddp.optimizer) == (4 * TP2_ELEMENTS, 4 * TP2_ELEMENTS, 8 * TP2_ELEMENTS + 4 * 29)
    assert (fsdp.shard, fsdp.params, fsdp.grads) == (2, 4 * TP2_FSDP2_ELEMENTS, 4 * TP2_FSDP2_ELEMENTS)
    assert fsdp.optimizer == 8 * TP2_FSDP2_ELEMENTS + 4 * 29  # two moments per element, a step per tensor (29)
    # the same model without TP holds every parameter whole
    assert estimate(prof, fp32_cfg(), Layout(2, 1, 64 * GiB)).plans["ddp"].params == 4 * FULL_ELEMENTS


def test_activations_split_over_tp_with_sequence_parallel_and_loss_parallel() -> None:
    prof = tiny_profile()
    sp = local_profile(prof, 2, sequence_parallel=True, loss_parallel=True)
    assert sp.act_by_block == tuple((a + 1) // 2 for a in prof.act_by_block)  # every saved tensor of a block
    assert sp.block_input_bytes == tuple(b // 2 for b in prof.block_input_bytes)  # a sequence shard
    vocab = prof.largest_act  # the loss's log-softmax over the vocabulary: split over the vocabulary shards
    assert sp.largest_act == vocab // 2 and sp.act_other == prof.act_other - vocab // 2
    no_sp = local_profile(prof, 2, sequence_parallel=False, loss_parallel=False)
    # Megatron-LM's count: 10 of 34 s*b*h per layer stay whole without sequence parallelism; 24 split
    assert no_sp.act_by_block[0] == pytest.approx(prof.act_by_block[0] * (10 + 24 / 2) / 34, abs=1)
    assert no_sp.largest_act == prof.largest_act and no_sp.act_other == prof.act_other  # logits gathered
    assert sp.activations() < no_sp.activations() < prof.activations()


def test_tp_bytes_per_step_formula() -> None:
    full = tiny_profile()
    act = MICRO * SEQ * CFG.d_model * 4  # micro-batch x sequence x d_model, fp32
    assert max(full.block_input_bytes) == act
    prof = local_profile(full, 2, sequence_parallel=True, loss_parallel=True)  # one rank's: a sequence shard
    assert max(prof.block_input_bytes) == act // 2
    # global batch 8 over 1 data-parallel group at micro-batch 4: 2 micro-steps
    colls = {c.kind: c for c in tp_collectives(prof, fp32_cfg(), tp=2, dp=1)}
    assert set(colls) == {"all_gather", "reduce_scatter"}
    # per block and micro-step: around attention and the MLP, in forward and again in backward
    calls = 2 * 2 * CFG.n_layers * 2
    for kind in ("all_gather", "reduce_scatter"):
        c = colls[kind]
        assert (c.nbytes, c.group, c.link, c.count) == (act, 2, "intra", calls)
        assert c.sent == calls * act / 2  # a ring of 2 sends half the buffer
    whole = local_profile(full, 2, sequence_parallel=False, loss_parallel=True)
    no_sp = tp_collectives(whole, fp32_cfg(sequence_parallel=False), tp=2, dp=1)
    assert [(c.kind, c.count) for c in no_sp] == [("all_reduce", calls)]
    assert no_sp[0].sent == 2 * colls["all_gather"].sent  # the same bytes as all-gather + reduce-scatter
    # activation checkpointing runs each block's forward (and its collectives) again
    ac = {c.kind: c.count for c in tp_collectives(prof, fp32_cfg(activation_checkpointing="full"), tp=2, dp=1)}
    assert ac["all_gather"] == calls + 2 * CFG.n_layers * 2
    assert tp_collectives(prof, fp32_cfg(), tp=1, dp=2) == []


def test_step_time_adds_tp_traffic() -> None:
    prof = tiny_profile()
    est = estimate(prof, fp32_cfg(), Layout(2, 1, 64 * GiB, tp=2))  # tp 2 alone: no data-parallel traffic
    t = est.times["ddp"]
    local = local_profile(prof, 2, sequence_parallel=True, loss_parallel=True)
    expected = sum(c.sent for c in tp_collectives(local, fp32_cfg(), tp=2, dp=1))
    assert expected == 2 * 16 * (MICRO * SEQ * CFG.d_model * 4) / 2  # 16 all-gathers, 16 reduce-scatters

    assert t.sent_intra == pytest.approx(expected) and t.sent_inter == 0
    assert t.comm_s > 0 and t.predicted_s >= t.compute_s + t.comm_s  # gloo: nothing hidden
    assert est.choice == "single" and "tensor parallelism alone (tp 2)" in est.reason


@pytest.mark.slow
def test_estimate_cli_prints_the_tp_columns() -> None:
    p = disttrain("estimate", "--parallel.nproc", "4", "--parallel.tp", "2", "--parallel.device", "cpu", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "FSDP x tp 2" in p.stdout and "tp degree" in p.stdout and "(tensor parallel: tp 2)" in p.stdout
    assert "step, no overlap" in p.stdout and "tp 2 ranks, given by --parallel.tp" in p.stdout
    js = disttrain("estimate", "--parallel.nproc", "4", "--parallel.tp", "2", "--parallel.device", "cpu", "--json")
    assert js.returncode == 0, js.stderr
    out = json.loads(js.stdout)
    one = json.loads(disttrain("estimate", "--parallel.nproc", "4", "--parallel.device", "cpu", "--json").stdout)
    assert out["layout"]["tp"] == 2 and one["layout"]["tp"] == 1
    # tp 2 over 2 data-parallel groups: the split parameters halve, DDP's copy is about half of tp 1's
    assert 0.45 < out["strategies"]["ddp"]["params"] / one["strategies"]["ddp"]["params"] < 0.55


def test_estimate_rejects_tp_that_does_not_divide_the_node() -> None:
    p = disttrain("estimate", "--parallel.nproc", "2", "--parallel.tp", "4", "--parallel.device", "cpu")
    assert p.returncode != 0 and "parallel.tp (4) must divide" in p.stderr, p.stderr


def test_param_info_name_defaults_keep_older_profiles_working() -> None:
    p = ParamInfo((4, 4), 0, True)
    assert p.name == "" and p.tp_dim == -1


def test_tp_degrees_stay_within_a_node() -> None:
    assert tp_degrees(1) == [] and tp_degrees(2) == [2] and tp_degrees(8) == [2, 4, 8] and tp_degrees(6) == [2]


def option(tp: int, fits: bool, step: float) -> TPOption:
    return TPOption(tp, "fsdp", f"FSDP x tp {tp}", 100 * 2**20, fits, step, 0.0)


def test_tp_pick_says_when_tp_helps_and_why() -> None:
    opts = (option(1, False, 0.5), option(2, False, 1.0), option(4, True, 2.0))
    # nothing fits at tp 1: the fastest TP layout that fits
    pick, why = tp_pick(opts, fits=False, inter_s=0, compute_s=1, step_s=1)
    assert pick is not None and pick.tp == 4 and why.startswith("nothing fits without tensor parallelism")
    none = tp_pick(opts[:2], fits=False, inter_s=0, compute_s=1, step_s=1)
    assert none == (None, "tensor parallelism up to tp 2 does not fit either")
    # it fits; traffic across nodes that compute covers: nothing to say
    assert tp_pick(opts, fits=True, inter_s=0.5, compute_s=1.0, step_s=3.0) == (None, "")
    # traffic across nodes beyond the compute, and a TP layout predicted faster than the step
    pick, why = tp_pick(opts, fits=True, inter_s=2.0, compute_s=1.0, step_s=3.0)
    assert pick is not None and pick.tp == 4 and "traffic across nodes" in why
    assert tp_pick(opts, fits=True, inter_s=2.0, compute_s=1.0, step_s=1.5) == (None, "")  # TP would be slower


@pytest.mark.slow
@pytest.mark.timeout(600)  # it may measure this machine first (minutes when busy)
def test_estimate_names_a_tp_layout_when_nothing_else_fits() -> None:
    args = ("estimate", "--parallel.nproc", "4", "--parallel.device", "cpu", "--parallel.device-memory", "250MiB")
    args += ("--precision.dtype", "bf16")  # the same plan on every machine (auto follows the hardware)
    # (a machine with no 4-rank link figure measures one first: minutes on a busy machine)
    p = disttrain(*args, "--explain", timeout=300)
    assert p.returncode == 0, p.stderr
    assert "recommended: fsdp — tp 2: nothing fits without tensor parallelism, and FSDP x tp 2 fits" in p.stdout
    assert "candidate layouts" in p.stdout and "* FSDP x tp 2" in p.stdout, p.stdout
    forced = disttrain(*args, "--parallel.strategy", "fsdp", timeout=300)  # a forced strategy: named, not run
    assert forced.returncode == 0 and "recommended: fsdp — nothing fits:" in forced.stdout, forced.stdout
    assert (
        "run with --parallel.tp 2" in forced.stdout
        and "to fit:" in forced.stdout
        and "--parallel.tp 2 (" in forced.stdout
    )


def test_run_resolves_auto_to_tensor_parallelism_when_nothing_else_fits() -> None:
    from disttrain.plan.choose import decide
    from disttrain.plan.estimate import plan_job

    cfg = from_dict({"parallel": {"device": "cpu"}, "precision": {"dtype": "bf16"}})  # auto follows the hardware
    est = plan_job(cfg, Layout(4, 1, 250 * 2**20), cross_entropy)
    assert est.layout.tp == 2 and est.choice == "fsdp" and est.reason.startswith("tp 2: nothing fits")
    assert [o.tp for o in est.tp_options] == [1, 2] and not est.tp_options[0].fits
    decision = decide(cfg, est)
    assert decision.strategy == "fsdp" and decision.parallel["tp"] == 2
    roomy = plan_job(cfg, Layout(4, 1, 64 * GiB), cross_entropy)  # fits without: tp stays as given
    assert roomy.layout.tp == 1 and "tp" not in decide(cfg, roomy).parallel


def test_run_applies_the_tp_auto_chose(tmp_path: object) -> None:
    p = disttrain(
        "run", "--parallel.device-memory", "400MiB", "--precision.dtype", "fp32", "--print-config", cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    assert "auto: tp 2: nothing fits without tensor parallelism" in p.stdout, p.stdout[:2000]
    assert "\ntp = 2\n" in p.stdout and '\nstrategy = "single"\n' in p.stdout
