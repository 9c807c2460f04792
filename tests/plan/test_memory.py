"""The memory plan: exact bytes against hand-computed figures, the choice `auto` makes, and bad input.

Multi-process measurements (the plan against what ranks really hold) are in test_memory_measure.py.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from disttrain.config import JobConfig, from_dict, parse_bytes
from disttrain.errors import ConfigError
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.parallel.strategies import dims_for
from disttrain.plan.choose import decide
from disttrain.plan.estimate import GiB, Layout, estimate, profile_model
from disttrain.train.loss import cross_entropy

from conftest import disttrain

pytestmark = pytest.mark.timeout(120)


class Tiny(nn.Module):
    """376 parameters in 8 tensors: a root of 80 + 80 (embedding, head), and 3 blocks of 8x8 + 8."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.head(h)


def tiny_profile(dtype: str = "fp32") -> object:
    sample = (torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    return profile_model(Tiny(), sample, micro_batch=2, loss_fn=cross_entropy, compute_dtype=dtype)


# Per-rank elements under FSDP2's dim-0 sharding with padding, worked by hand:
#   N=1: 80 + 3 x (64 + 8) + 80 = 376
#   N=2: emb ceil(10/2)=5 rows x 8 = 40; weight 4 x 8 = 32; bias 4; head 40  -> 40 + 3 x 36 + 40 = 188
#   N=4: emb 3 x 8 = 24; weight 2 x 8 = 16; bias 2; head 24                   -> 24 + 3 x 18 + 24 = 102
#   N=8: emb 2 x 8 = 16; weight 1 x 8 = 8; bias 1; head 16                    -> 16 + 3 x 9 + 16 = 59
ELEMENTS = {1: 376, 2: 188, 4: 102, 8: 59}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_params_grads_adam_bytes_match_hand_computed(n: int, dtype: str) -> None:
    prof = tiny_profile(dtype)
    cfg = from_dict({"precision": {"dtype": dtype}})
    est = estimate(prof, cfg, Layout(n, 1, GiB))  # type: ignore[arg-type]
    e = ELEMENTS[n]
    # fp32 master weights and gradients in both precisions; AdamW: 2 fp32 moments + a 4-byte step per tensor
    want = {"params": 4 * e, "grads": 4 * e, "optimizer": 8 * e + 4 * 8}
    fsdp = est.plans["fsdp"]
    assert {k: fsdp.row(k) for k in want} == want
    ddp = est.plans["ddp"]
    assert {k: ddp.row(k) for k in want} == {"params": 1504, "grads": 1504, "optimizer": 3040}
    assert est.plans["fsdp_offload"].host == sum(want.values()) and est.plans["fsdp_offload"].params == 0


def test_gathered_and_low_precision_copies_by_hand() -> None:
    prof = tiny_profile("bf16")
    one = {"precision": {"dtype": "bf16"}, "parallel": {"blocks_per_unit": 1, "root_units": "one"}}
    est = estimate(prof, from_dict(one), Layout(2, 1, GiB))  # type: ignore[arg-type]
    # DDP under autocast: bf16 copies of the 2-D weights: (80 + 3 x 64 + 80) x 2 bytes
    assert est.plans["ddp"].gathered == 352 * 2
    # FSDP at N=2: root 160 + a block and the one prefetched (2 x 72), in bf16; the head's gradient (80, in the
    # root unit: held from the start of backward) in bf16 + fp32
    assert est.plans["fsdp"].gathered == (160 + 2 * 72) * 2 + 80 * (2 + 4)
    # no reshard: every unit stays gathered from forward to backward
    assert est.plans["fsdp_no_reshard"].gathered == (160 + 3 * 72) * 2 + 80 * (2 + 4)
    # 3 blocks per unit: one unit of 216 (nothing to prefetch), its gradient in bf16 + fp32
    three = estimate(prof, from_dict({**one, "parallel": {"blocks_per_unit": 3}}), Layout(2, 1, GiB))  # type: ignore[arg-type]
    assert three.plans["fsdp"].gathered == (160 + 216) * 2 + 216 * (2 + 4)
    # root_units auto: embedding and head (80 each) outweigh a block unit (72), so they are units of their own
    # and the root holds nothing: the biggest neighbours (a block and the head: 72 + 80), the head's gradient
    split = estimate(prof, from_dict({**one, "parallel": {"blocks_per_unit": 1}}), Layout(2, 1, GiB))  # type: ignore[arg-type]
    assert split.plans["fsdp"].gathered == (0 + 72 + 80) * 2 + 80 * (2 + 4)


def test_activation_checkpointing_keeps_only_block_inputs() -> None:
    # each block's input is (2, 4, 8) fp32 = 256 bytes
    assert tiny_profile().block_input_bytes == (256, 256, 256)  # type: ignore[attr-defined]
    with torch.device("meta"):
        gpt = GPT(GPTConfig(vocab_size=65, n_layers=4, d_model=64, n_heads=4, context=32))
    sample = (torch.zeros(32, dtype=torch.long), torch.zeros(32, dtype=torch.long))
    prof = profile_model(gpt, sample, micro_batch=8, loss_fn=cross_entropy)
    none, full, every2 = (prof.activations(ac) for ac in ("none", "full", "2"))
    assert full < every2 < none
    block_in = 8 * 32 * 64 * 4
    assert prof.block_input_bytes == (block_in,) * 4
    # full: every block keeps only its input; one block is recomputed at a time in backward
    assert full == prof.act_other + 4 * block_in + max(prof.act_by_block) + 2 * prof.largest_act


@pytest.mark.timing
def test_seventy_billion_parameter_config_estimates_in_seconds() -> None:
    t0 = time.process_time()  # CPU seconds of this process: a busy machine does not count against it
    cfg = GPTConfig(vocab_size=32000, n_layers=80, d_model=8192, n_heads=64, context=4096)
    with torch.device("meta"):
        model = GPT(cfg)
    sample = (torch.zeros(4096, dtype=torch.long), torch.zeros(4096, dtype=torch.long))
    prof = profile_model(model, sample, micro_batch=1, loss_fn=cross_entropy, compute_dtype="bf16")
    est = estimate(prof, from_dict({"precision": {"dtype": "bf16"}}), Layout(8, 8, 80 * GiB))
    assert time.process_time() - t0 < 60
    n = prof.n_params
    assert 60e9 < n < 80e9
    # DDP holds 16 bytes per parameter (fp32 params + grads + 2 Adam moments): it cannot fit 80 GiB
    assert est.plans["ddp"].params + est.plans["ddp"].grads + est.plans["ddp"].optimizer >= 16 * n
    assert not est.fits["ddp"]
    assert est.choice in ("hsdp", "fsdp")


def default_estimate(mem: str, nnodes: int = 1, **parallel: object) -> object:
    from disttrain.plan.estimate import plan_job

    cfg = from_dict({"parallel": {"device": "cpu", **parallel}})
    return plan_job(cfg, Layout(2, nnodes, parse_bytes(mem)), cross_entropy)


def test_auto_picks_ddp_fsdp_hsdp_from_the_plan() -> None:
    roomy = default_estimate("80GiB")
    assert roomy.choice == "ddp" and "fits" in roomy.reason  # type: ignore[attr-defined]
    ddp_total = roomy.plans["ddp"].total  # type: ignore[attr-defined]
    fsdp_total = roomy.plans["fsdp"].total  # type: ignore[attr-defined]
    between = f"{int((ddp_total + fsdp_total) / 2 / 0.9)}B"  # DDP does not fit, FSDP does (10% headroom)
    tight = default_estimate(between)
    # DDP does not fit: the fastest sharded plan that fits (FSDP, or FSDP without reshard where it fits too)
    assert tight.choice in ("fsdp", "fsdp_no_reshard") and tight.fits[tight.choice]  # type: ignore[attr-defined]
    assert "DDP needs" in tight.reason and "more than the" in tight.reason  # type: ignore[attr-defined]
    assert default_estimate(between, nnodes=2).choice == "hsdp"  # type: ignore[attr-defined]


def test_forced_strategy_that_cannot_fit_asks_for_force() -> None:
    cfg = from_dict({"parallel": {"device": "cpu", "strategy": "ddp"}})
    est = default_estimate("100MiB", strategy="ddp")
    with pytest.raises(ConfigError, match=r"(?s)does not fit.*--parallel.force"):
        decide(cfg, est)  # type: ignore[arg-type]
    forced = from_dict({"parallel": {"device": "cpu", "strategy": "ddp", "force": True}})
    assert decide(forced, est)[0] == "ddp"  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"(?s)no strategy fits.*activation_checkpointing full"):
        decide(from_dict({"parallel": {"device": "cpu"}}), est)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "value"), [("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("512 MiB", 512 * 2**20), ("1000B", 1000)]
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["abc", "80 GiBs", "-1GB", "0", "80", "1000"])
def test_parse_bytes_rejects(bad: str) -> None:
    """A size without a unit (`80`: bytes? GiB?) is an error that names the units."""
    with pytest.raises(ConfigError, match=r"e\.g\. 80GiB.*units: B, kB/KiB"):
        parse_bytes(bad)


def test_hsdp_degrees() -> None:
    assert (dims_for("hsdp", 4, local_world_size=2).replicate, dims_for("hsdp", 4).shard) == (2, 4)
    d = dims_for("hsdp", 8, replicate=2)
    assert (d.replicate, d.shard) == (2, 4)
    with pytest.raises(ConfigError, match=r"parallel.replicate \(3\) must divide the world size \(4\)"):
        dims_for("hsdp", 4, replicate=3)
    with pytest.raises(ConfigError, match=r"2\) x parallel.shard \(4\) = 8, but the world size is 4"):
        dims_for("hsdp", 4, replicate=2, shard=4)
    with pytest.raises(ConfigError, match=r"use --parallel\.strategy hsdp"):
        dims_for("ddp", 4, shard=2)


@pytest.mark.slow
@pytest.mark.timeout(600)  # it may measure this machine first (minutes when busy)
def test_estimate_cli_json_and_reason() -> None:
    nodes_8x2 = ("--parallel.nproc", "8", "--launch.nnodes", "2", "--parallel.device-memory", "80GiB")
    # links as given (a 100 Mbit/s link between the nodes): the intra-node link measured on a busy machine at 8
    # ranks moved DDP and HSDP within 1% of each other
    links = ("--bandwidth", "1GB/s", "--inter-node-bandwidth", "12.5MB/s")
    p = disttrain("estimate", *nodes_8x2, *links, "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out["strategies"]) == {"ddp", "fsdp", "fsdp_no_reshard", "hsdp", "fsdp_offload"}
    assert out["strategies"]["fsdp"]["shard"] == 16 and out["strategies"]["hsdp"]["shard"] == 8
    # everything fits 80 GiB; across 2 nodes HSDP sends a node's shard of the gradients over the slower link
    assert out["recommendation"]["strategy"] == "hsdp", out["recommendation"]
    assert out["step_time"]["hsdp"]["sent_inter"] < out["step_time"]["ddp"]["sent_inter"]
    bf16 = ("--precision.dtype", "bf16")  # the same plan on every machine (auto follows the hardware)
    text = disttrain("estimate", "--parallel.device-memory", "440MiB", *bf16, timeout=120)
    assert text.returncode == 0 and "recommended: fsdp" in text.stdout and "DDP needs" in text.stdout
    # across nodes in fp32 (in hardware on every CPU: where bf16 is emulated, ~1 GFLOP/s, its compute dwarfs
    # every difference in traffic and the strategies rightly tie)
    fp32 = ("--precision.dtype", "fp32")
    nodes = disttrain("estimate", "--parallel.device-memory", "560MiB", "--launch.nnodes", "2", *fp32, timeout=120)
    assert nodes.returncode == 0 and "recommended: hsdp" in nodes.stdout, nodes.stdout
    assert "HSDP keeps all-gathers inside a node" in nodes.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["estimate", "--parallel.device-memory", "lots"], "parallel.device_memory: cannot read 'lots' as a size"),
        (["run", "--parallel.strategy", "hsdp", "--parallel.replicate", "3"], "must divide the world size (2)"),
        (["run", "--parallel.device-memory", "80 bytes please"], "parallel.device_memory: cannot read"),
        (["run", "--parallel.activation-checkpointing", "sometimes"], "none, full, or K >= 1"),
        (["run", "--parallel.strategy", "ddp", "--parallel.offload"], "needs strategy fsdp, hsdp or auto"),
        (["run", "--model.module", "usermodel:not_on_meta", "--parallel.strategy", "fsdp"], "cannot be built on"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    extra = ["--parallel.device", "cpu"] + (["--print-config"] if args[0] == "run" else [])
    p = disttrain(*args, *extra, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("disttrain: error:") and message in lines[0], p.stderr


def test_run_prints_the_choice(tmp_path: object) -> None:
    p = disttrain(
        "run",
        "--parallel.device",
        "cpu",
        "--parallel.device-memory",
        "420MiB",
        "--precision.dtype",
        "bf16",
        "--print-config",
    )
    assert p.returncode == 0, p.stderr
    assert 'strategy = "fsdp"' in p.stdout and "# strategy fsdp: auto: DDP needs" in p.stdout
    assert JobConfig().parallel.strategy == "auto"


def gpt_profile(context: int, attention: str) -> object:
    model = GPT(GPTConfig(vocab_size=32, n_layers=2, d_model=64, n_heads=4, context=context))
    sample = (torch.zeros(context, dtype=torch.long), torch.zeros(context, dtype=torch.long))
    return profile_model(model, sample, micro_batch=2, loss_fn=cross_entropy, compute_dtype="bf16", attention=attention)


def test_flash_attention_activations_grow_linearly_with_the_context() -> None:
    # CUDA's fused attention keeps q, k, v, the output and the log-sum-exp: O(T) per head. The meta device's math
    # path keeps the T x T probabilities. Everything else in a block is linear in T, so flash doubles exactly.
    flash = {t: gpt_profile(t, "flash").act_by_block for t in (64, 128)}  # type: ignore[attr-defined]
    math_ = {t: gpt_profile(t, "math").act_by_block for t in (64, 128)}  # type: ignore[attr-defined]
    assert [2 * a for a in flash[64]] == list(flash[128])
    assert all(m > 2 * a for m, a in zip(math_[128], math_[64], strict=True))
    # the difference at T=128 is at least the bf16 probabilities of one block: 2 x 4 heads x 128^2 x 2 bytes
    assert math_[128][0] - flash[128][0] >= 2 * 4 * 128 * 128 * 2


@pytest.mark.slow
def test_estimate_for_cuda_accounts_flash_attention() -> None:
    big = ("--model.context", "1024", "--train.micro-batch", "1", "--train.global-batch", "8", "--json")
    common = (
        "estimate",
        "--parallel.nproc",
        "8",
        "--parallel.device-memory",
        "80GiB",
        "--precision.dtype",
        "bf16",
        *big,
    )
    cuda = json.loads(disttrain(*common, "--parallel.device", "cuda", timeout=120).stdout)
    cpu = json.loads(disttrain(*common, "--parallel.device", "cpu", timeout=120).stdout)
    assert (cuda["attention"], cpu["attention"]) == ("flash", "math")
    act = {k: v["strategies"]["ddp"]["activations"] for k, v in (("cuda", cuda), ("cpu", cpu))}
    assert act["cuda"] < act["cpu"] / 2, act
    if not torch.cuda.is_available():  # planning for GPUs from a machine without one needs their memory size
        p = disttrain("estimate", "--parallel.device", "cuda", timeout=120)
        assert p.returncode == 2 and "e.g. --parallel.device-memory 80GiB" in p.stderr, p.stderr
