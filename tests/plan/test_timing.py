"""The step-time plan: the collectives each strategy runs (counted by hand), ring times, the grouping of blocks
into FSDP units, the strategy ``auto`` picks by predicted time, and the resolved knobs reaching the workers.

Measured step times against the prediction are in test_memory_measure.py (the same launches) and
benchmarks/bench_plan_time.py.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from test_memory import Tiny  # 376 parameters: root 160 (embedding, head), 3 blocks of 72

from disttrain.config import from_dict
from disttrain.errors import ConfigError
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.plan.choose import decide
from disttrain.plan.comm import collectives, unit_numels
from disttrain.plan.estimate import GiB, Layout, estimate, profile_model
from disttrain.plan.machine import LinkFit
from disttrain.plan.timing import (
    OP_OVERHEAD_S,
    OPTIMIZER_ELEMENTS_PER_PARAM,
    Machine,
    best_grouping,
    grouping_candidates,
    step_time,
)
from disttrain.train.loss import cross_entropy

from conftest import disttrain

pytestmark = pytest.mark.timeout(120)


def tiny_profile(micro_batch: int = 2):  # type: ignore[no-untyped-def]
    sample = (torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    return profile_model(Tiny(), sample, micro_batch=micro_batch, loss_fn=cross_entropy)


def machine(latency: float = 1e-4, bandwidth: float = 1e9, inter: float | None = None, device: str = "cpu") -> Machine:
    links = {"intra": LinkFit(latency, bandwidth, 2)}
    if inter is not None:
        links["inter"] = LinkFit(latency, inter, 2)
    return Machine(device, 0.1, 0.5, 2, links)


def test_collectives_are_what_ddp_and_fsdp2_run() -> None:
    prof = tiny_profile()
    # 2 ranks, micro-batch 2, global batch 8: 2 micro-steps per optimizer step
    cfg = from_dict(
        {
            "train": {"micro_batch": 2, "global_batch": 8},
            "precision": {"dtype": "fp32"},
            "parallel": {"root_units": "one"},
        }
    )
    assert unit_numels(prof, 2, 1) == (160, [72, 72, 72]) and unit_numels(prof, 2, 2) == (160, [144, 72])
    ddp = collectives("ddp", prof, cfg, 2, 1, 1)
    assert [(c.kind, c.nbytes, c.count) for c in ddp] == [("all_reduce", 376 * 4, 1), ("all_reduce", 16, 1)]
    assert ddp[0].sent == 376 * 4  # a ring all-reduce sends 2 (n-1)/n of the buffer: all of it at n = 2
    fsdp = collectives("fsdp", prof, cfg, 2, 1, 1)
    gathers = [c.count for c in fsdp if c.kind == "all_gather"]
    # forward every micro-step (2), backward again for the resharded units (not the last one, not the root)
    assert gathers == [4, 4, 2, 2]
    assert [c.nbytes for c in fsdp if c.kind == "reduce_scatter"] == [72 * 4, 72 * 4, 72 * 4, 160 * 4]
    assert all(c.count == 1 for c in fsdp if c.kind == "reduce_scatter")  # only on the last micro-step
    no_reshard = collectives("fsdp_no_reshard", prof, cfg, 2, 1, 1)
    assert [c.count for c in no_reshard if c.kind == "all_gather"] == [2, 2, 2, 2]
    hsdp = collectives("hsdp", prof, cfg, 2, 2, 1)  # 2 nodes x 2 ranks: 1 micro-step at global batch 8
    across = [c for c in hsdp if c.what.startswith("gradient all-reduce across")]
    assert len(across) == 1 and across[0].link == "inter" and across[0].nbytes == (160 + 216) // 2 * 4
    assert all(c.link == "intra" for c in hsdp if c.kind != "all_reduce")


def test_embeddings_and_head_get_units_of_their_own_when_they_outweigh_a_block() -> None:
    prof = tiny_profile()
    cfg = from_dict({"train": {"micro_batch": 2, "global_batch": 8}, "precision": {"dtype": "fp32"}})
    # auto: embedding + head (160) >= a block unit (72): a unit before the blocks and one after; root empty
    assert unit_numels(prof, 2, 1, "auto") == (0, [80, 72, 72, 72, 80])
    assert unit_numels(prof, 2, 3, "auto") == (160, [216])  # one unit of 216 outweighs them: root
    assert unit_numels(prof, 2, 3, "split") == (0, [80, 216, 80])
    fsdp = collectives("fsdp", prof, cfg, 2, 1, 1)
    # every unit but the last (the head) is gathered again in backward; no root collectives
    assert [(c.nbytes // 4, c.count) for c in fsdp if c.kind == "all_gather"] == [(80, 4), *[(72, 4)] * 3, (80, 2)]
    assert not any(c.what.startswith("root") for c in fsdp)


def test_ring_times_add_up_to_the_step() -> None:
    prof = tiny_profile()
    cfg = from_dict({"train": {"micro_batch": 2, "global_batch": 4}, "precision": {"dtype": "fp32"}})
    m = machine(latency=1e-3, bandwidth=1e6)
    t = step_time("ddp", prof, cfg, m, 2, 1, 1)
    # one all-reduce of 1504 bytes over 2 ranks: 2 x (latency + 752 B / 1 MB/s), plus the loss's 16 bytes
    assert t.comm_s == pytest.approx(2 * (1e-3 + 752e-6) + 2 * (1e-3 + 8e-6))
    # FLOPs at the peak x efficiency, plus the framework time of every operator forward and backward dispatch
    assert prof.forward_ops > 0
    assert t.compute_s == pytest.approx(prof.train_flops / (0.1e12 * 0.5) + 3 * prof.forward_ops * OP_OVERHEAD_S["cpu"])
    assert t.predicted_s == t.no_overlap_s == pytest.approx(t.compute_s + t.comm_s)  # gloo: no overlap
    assert t.sent_intra == pytest.approx(1504 + 16)
    gpu = step_time("ddp", prof, cfg, machine(1e-3, 1e6, device="cuda"), 2, 1, 1)
    assert gpu.predicted_s == gpu.overlap_s <= gpu.no_overlap_s
    # with an element-wise rate: the forward's elements, about twice that in backward, at that rate per thread
    counted = step_time("ddp", prof, cfg, dataclasses.replace(m, elementwise_rate=1e6), 2, 1, 1)
    assert prof.forward_elements > 0
    assert counted.compute_s == pytest.approx(t.compute_s + 3 * prof.forward_elements / 1e6)
    assert counted.framework_s == pytest.approx(counted.compute_s - prof.train_flops / (0.1e12 * 0.5))
    # and the optimizer's element-wise work over the parameters a rank holds: all 376 with DDP, half with FSDP
    assert counted.optimizer_s == pytest.approx(OPTIMIZER_ELEMENTS_PER_PARAM * 376 / 1e6)
    assert counted.predicted_s == pytest.approx(counted.compute_s + counted.comm_s + counted.optimizer_s)
    fsdp = step_time("fsdp", prof, cfg, dataclasses.replace(m, elementwise_rate=1e6), 2, 1, 1)
    assert fsdp.optimizer_s == pytest.approx(OPTIMIZER_ELEMENTS_PER_PARAM * 376 / 2 / 1e6)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = torch.nn.LayerNorm(16), torch.nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.fc(self.norm(x)).view(x.shape[0], 2, 4, 4)  # a view writes nothing
        att = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return torch.nn.functional.gelu(att.flatten(1)) + x.repeat(1, 2)


def test_the_profile_counts_the_elements_element_wise_operators_write() -> None:
    """The layer norm (8 x 16, plus its mean and rstd), the attention's output only (a fused kernel on the
    devices: 8 x 32; the meta device's math path writes its scores and softmax), the repeat, the GELU and the
    add (8 x 32 each) and the loss; not the Linear (a matmul: its FLOPs) and not the views."""
    sample = (torch.zeros(16), torch.zeros(()))
    prof = profile_model(torch.nn.Sequential(Block()), sample, micro_batch=8, loss_fn=lambda out, _: out.sum())
    assert prof.forward_elements == 8 * 16 + 2 * 8 + 4 * 8 * 32 + 1
    # planned for CUDA's fused kernels: the same, and the log-sum-exp per query row (8 x 2 heads x 4 queries)
    flash = profile_model(
        torch.nn.Sequential(Block()), sample, micro_batch=8, loss_fn=lambda out, _: out.sum(), attention="flash"
    )
    assert flash.forward_elements == prof.forward_elements + 8 * 2 * 4


def gpt_profile(layers: int, width: int, heads: int, context: int, dtype: str = "fp32"):  # type: ignore[no-untyped-def]
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=65, n_layers=layers, d_model=width, n_heads=heads, context=context))
    sample = (torch.zeros(context, dtype=torch.long), torch.zeros(context, dtype=torch.long))
    return profile_model(model, sample, micro_batch=8, loss_fn=cross_entropy, compute_dtype=dtype)


def test_small_blocks_are_grouped_and_big_blocks_stay_alone() -> None:
    assert grouping_candidates(24) == [1, 2, 3, 4, 5, 6, 8, 12, 24] and grouping_candidates(1) == [1]
    cfg = from_dict({"train": {"micro_batch": 8, "global_batch": 16}, "precision": {"dtype": "fp32"}})
    small = estimate(gpt_profile(24, 128, 4, 128), cfg, Layout(2, 1, 64 * GiB), machine(latency=2e-3))
    k = small.times["fsdp"].blocks_per_unit
    assert k > 1, small.groupings["fsdp"]
    tried = small.groupings["fsdp"]
    assert tried[1].predicted_s > 1.05 * tried[k].predicted_s and tried[1].calls > tried[k].calls
    big_cfg = from_dict({"train": {"micro_batch": 1, "global_batch": 8}, "precision": {"dtype": "bf16"}})
    big = estimate(gpt_profile(4, 2048, 16, 256, "bf16"), big_cfg, Layout(8, 1, 80 * GiB), machine(1e-5, 1e11))
    assert big.times["fsdp"].blocks_per_unit == 1  # a 100 MB unit already uses the link fully
    # a grouping that does not fit is never chosen
    assert best_grouping(tried, {kk: kk == 1 for kk in tried}) == 1


def test_auto_picks_the_fastest_strategy_that_fits_and_says_both_numbers() -> None:
    cfg = from_dict({"train": {"micro_batch": 8, "global_batch": 32}, "precision": {"dtype": "fp32"}})
    prof = gpt_profile(4, 256, 4, 64)
    est = estimate(prof, cfg, Layout(2, 2, 64 * GiB), machine(inter=0.05e9))
    # DDP all-reduces every gradient across the slow link; HSDP only a node's shard of them
    assert est.choice == "hsdp" and est.times["hsdp"].sent_inter < est.times["ddp"].sent_inter
    assert "HSDP is predicted fastest" in est.reason and "against" in est.reason and "s/step" in est.reason
    one_node = estimate(prof, cfg, Layout(2, 1, 64 * GiB), machine())
    assert one_node.choice == "ddp" and "it fits" in one_node.reason
    # bf16 gathers without resharding send 3 bytes per parameter, DDP's fp32 all-reduce 4: on a slow link
    bf16 = from_dict(
        {
            "train": {"micro_batch": 8, "global_batch": 16},
            "precision": {"dtype": "bf16"},
            "parallel": {"device": "cpu", "blocks_per_unit": 1},
        }
    )
    big = gpt_profile(4, 1024, 8, 64, "bf16")
    slow = estimate(big, bf16, Layout(2, 1, 64 * GiB), machine(bandwidth=1e8))
    assert slow.choice == "fsdp_no_reshard", {k: t.predicted_s for k, t in slow.times.items()}
    strategy, reason, tuned = decide(bf16, slow)
    # gloo: no compute to hide behind, prefetch 1
    assert strategy == "fsdp" and tuned == {
        "reshard_after_forward": "never",
        "forward_prefetch": 1,
        "backward_prefetch": 1,
    }
    assert "FSDP no-reshard is predicted fastest" in reason


def test_a_tie_within_one_percent_goes_to_the_simpler_strategy() -> None:
    from disttrain.plan.estimate import recommend

    cfg = from_dict({"train": {"micro_batch": 8, "global_batch": 32}, "precision": {"dtype": "fp32"}})
    est = estimate(gpt_profile(4, 256, 4, 64), cfg, Layout(2, 1, 64 * GiB), machine())
    ddp = est.times["ddp"].predicted_s

    def fsdp_at(ratio: float) -> tuple[str, str]:
        t = est.times["fsdp"]
        faster = dataclasses.replace(t, compute_s=t.compute_s + ddp * ratio - t.predicted_s)
        return recommend(dataclasses.replace(est, times={**est.times, "fsdp": faster}))

    choice, reason = fsdp_at(0.995)  # FSDP predicted 0.5% faster: a tie
    assert choice == "ddp" and "DDP is predicted within 1% of the fastest" in reason and "a tie goes" in reason
    choice, reason = fsdp_at(0.98)
    assert choice == "fsdp" and "FSDP is predicted fastest" in reason and "against DDP" in reason, reason


def test_forced_settings_are_kept() -> None:
    cfg = from_dict(
        {
            "parallel": {"device": "cpu", "strategy": "fsdp", "blocks_per_unit": 2, "forward_prefetch": 0},
            "train": {"micro_batch": 8, "global_batch": 16},
            "precision": {"dtype": "fp32"},
        }
    )
    est = estimate(gpt_profile(24, 128, 4, 128), cfg, Layout(2, 1, 64 * GiB), machine())
    assert list(est.groupings["fsdp"]) == [2]
    assert decide(cfg, est).parallel == {"backward_prefetch": 1}  # only what was left to auto
    with pytest.raises(ConfigError, match=r"parallel.blocks_per_unit must be auto or an integer >= 1, got 0"):
        from_dict({"parallel": {"blocks_per_unit": 0}})


@pytest.mark.slow
def test_estimate_cli_explains_and_takes_a_bandwidth(tmp_path) -> None:
    small = ("--model.n-layers", "12", "--model.d-model", "64", "--model.n-heads", "4", "--model.context", "32")
    p = disttrain("estimate", *small, "--explain", "--bandwidth", "2GB/s", "--precision.dtype", "fp32", timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "step, no overlap *" in out and "sent per rank / step" in out
    assert re.search(r"intra \d+ us \+ 2 GB/s \(--bandwidth\)", out), out  # the measured latency, the given rate
    assert "blocks/unit" in out and "chosen:" in out and "prefetch: depth 1" in out and "collectives of" in out
    bad = disttrain("estimate", "--bandwidth", "fast", timeout=60)
    assert bad.returncode == 2 and "--bandwidth" in bad.stderr and "fast" in bad.stderr
    assert "Traceback" not in bad.stderr
    run = disttrain("run", "--print-config", "--parallel.strategy", "fsdp", *small, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "block(s) per FSDP unit" in run.stdout and "blocks_per_unit = " in run.stdout
    assert 'blocks_per_unit = "auto"' not in run.stdout and "forward_prefetch = 1" in run.stdout


def test_estimate_measure_keeps_the_median_efficiency_of_its_recent_runs() -> None:
    from disttrain.jobs.estimate import learn_efficiency
    from disttrain.plan.machine import load_machine

    cfg = from_dict({"train": {"micro_batch": 8, "global_batch": 16}, "precision": {"dtype": "fp32"}})
    est = estimate(gpt_profile(4, 256, 4, 64), cfg, Layout(2, 1, 64 * GiB), machine())
    t = est.times["ddp"]
    flops_s = t.compute_s - t.framework_s  # at the machine's efficiency, 0.5
    assert flops_s > 2 * t.framework_s  # FLOPs dominate: the step says something about the efficiency

    def run(reached: float) -> str:  # measured steps whose FLOPs ran at `reached` of the peak
        return learn_efficiency(
            est, {"ddp": {"step_s": flops_s * 0.5 / reached + t.framework_s + 0.01, "comm_s": 0.01}}
        )

    assert "reached 0.80" in run(0.8) and load_machine().efficiency["fp32"] == pytest.approx(0.8)  # type: ignore[union-attr]
    run(0.6)
    line = run(0.7)
    assert "these steps reached 0.70" in line and "the next plans use 0.70" in line, line
    for _ in range(3):
        run(0.9)
    cached = load_machine()
    assert cached is not None and cached.efficiency_runs["fp32"] == pytest.approx([0.6, 0.7, 0.9, 0.9, 0.9])
    assert cached.efficiency["fp32"] == pytest.approx(0.9)
    # faster than the peak: the machine's figures are off, and the run says so instead of learning 1.2
    line = run(1.2)
    assert "ran at 1.20 of the fp32 matmul peak, above what the peak allows" in line and "not kept" in line, line
    assert load_machine().efficiency["fp32"] == pytest.approx(0.9)  # type: ignore[union-attr]
    # what was learned is visible and can be reset
    from disttrain.plan.timing import forget_efficiency

    assert forget_efficiency().startswith("reset the learned compute efficiency (fp32: 5 run(s), 0.90)")
    assert load_machine().efficiency == {} and forget_efficiency().startswith("no learned")  # type: ignore[union-attr]
