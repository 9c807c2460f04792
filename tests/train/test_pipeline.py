"""Pipeline parallelism (``--parallel.pp``, torch.distributed.pipelining) on real gloo processes against one
process (fp32, the built-in GPT, 4 blocks): gpipe, 1f1b, interleaved-1f1b (2 stages per rank) and zbv with and
without gradient accumulation, pp 2 x fsdp 2 and pp 2 x tp 2 on 4 ranks, clipping that bites, checkpoints moved
between pipeline and other layouts (and a kill -9 under pp 2 resumed bitwise); the layout arithmetic and the
stage cut as units; every wrong layout one line before any worker starts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from disttrain.config import ParallelConfig
from disttrain.errors import ConfigError
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.parallel.blocks import StageBlocks, find_blocks
from disttrain.parallel.pipeline_layout import StageCosts, balanced_starts, plan_pipeline
from disttrain.parallel.stages import cut_model, plan_for_model, stage_costs
from disttrain.testing.launch import together
from disttrain.testing.tiny import tiny_cli_args

from conftest import assert_one_line, disttrain, losses_by_step

STEPS = 8
LAYERS = (4, 64, 4)  # 4 blocks: 2 per stage at pp 2, 1 per stage with 2 stages per rank


def _gpt(layers: int = 4) -> GPT:
    return GPT(GPTConfig(vocab_size=65, context=32, n_layers=layers, d_model=32, n_heads=4))


# -- the layout: units ----------------------------------------------------------------------------------
def test_balanced_split_evens_equal_blocks_and_moves_blocks_off_a_costly_head() -> None:
    assert balanced_starts(StageCosts([1.0] * 8), 2) == (0, 4)
    assert balanced_starts(StageCosts([1.0] * 8), 4) == (0, 2, 4, 6)
    # a head as costly as two blocks: the last stage takes fewer blocks
    assert balanced_starts(StageCosts([1.0] * 8, last=2.0), 2) == (0, 5)
    assert balanced_starts(StageCosts([1.0] * 6, first=1.0, last=2.5), 3) == (0, 2, 5)  # 3, 3 and 3.5
    costs = stage_costs(_gpt(), "gpt")
    assert len(costs.blocks) == 4 and costs.first == 0.0
    assert costs.last == 65 * 32  # the head's weight (the norm has no matmul)
    assert costs.blocks[0] == sum(p.numel() for p in _gpt().blocks[0].parameters() if p.dim() >= 2)


def test_layouts_resolve_auto_and_place_stages() -> None:
    one = plan_pipeline(2, "auto", 0, 0, "", StageCosts([1.0] * 4), 8)
    assert (one.schedule, one.microbatches, one.stages_per_rank, one.starts) == ("1f1b", 4, 1, (0, 2))
    assert one.stages_of(0) == [0] and one.stages_of(1) == [1]
    assert list(one.blocks_of(1)) == [2, 3]
    looped = plan_pipeline(2, "interleaved-1f1b", 4, 2, "", StageCosts([1.0] * 4), 8)
    assert looped.stages_of(0) == [0, 2] and looped.stages_of(1) == [1, 3]
    v = plan_pipeline(2, "zbv", 0, 0, "", StageCosts([1.0] * 4), 8)
    assert v.stages_per_rank == 2 and v.stages_of(0) == [0, 3] and v.stages_of(1) == [1, 2]
    given = plan_pipeline(2, "gpipe", 2, 1, "1", StageCosts([1.0] * 4), 8)
    assert given.starts == (0, 1) and given.describe() == "pp 2 (gpipe, 2 micro-batches; stages: blocks 0 | 1-3)"


BAD_LAYOUTS = [
    # (pp, schedule, microbatches, stages per rank, split, micro batch) over 4 blocks -> what the message names
    ((2, "1f1b", 1, 0, "", 8), "fewer than the 2 pipeline stages"),
    ((2, "interleaved-1f1b", 2, 2, "", 8), "fewer than the 4 pipeline stages"),
    ((2, "1f1b", 3, 0, "", 8), "does not divide into parallel.pp_microbatches 3"),
    ((2, "1f1b", 0, 2, "", 8), "runs one stage per rank"),
    ((2, "interleaved-1f1b", 0, 1, "", 8), "set it to 2 or more"),
    ((2, "zbv", 0, 3, "", 8), "exactly 2 stages per rank"),
    ((5, "1f1b", 0, 0, "", 10), "the model has 4 blocks"),
    ((2, "1f1b", 0, 0, "2,3", 8), "the 1 block indices where stages 1..1 begin"),
    ((2, "1f1b", 0, 0, "0", 8), "each in 1..3"),
    ((2, "1f1b", 0, 0, "two", 8), "e.g. 2"),
    ((2, "pipedream", 0, 0, "", 8), "must be auto or one of gpipe, 1f1b"),
]


@pytest.mark.parametrize(("args", "says"), BAD_LAYOUTS)
def test_a_wrong_layout_is_a_config_error_naming_it(args: tuple[int, str, int, int, str, int], says: str) -> None:
    pp, schedule, m, v, split, micro = args
    with pytest.raises(ConfigError) as e:
        plan_pipeline(pp, schedule, m, v, split, StageCosts([1.0] * 4), micro)
    assert says in str(e.value), str(e.value)


def test_the_cut_keeps_each_parameter_name_and_views_share_the_parameters() -> None:
    whole = _gpt()
    names = dict(whole.named_parameters())
    layout = plan_for_model(whole, "gpt", ParallelConfig(pp=2, pp_schedule="interleaved-1f1b"), 8)
    rank0 = _gpt()
    stages = cut_model(rank0, layout, 0, "gpt")
    held = dict(rank0.named_parameters())
    assert set(held) < set(names) and all(held[n].shape == names[n].shape for n in held)
    assert {n.split(".")[1] for n in held if n.startswith("blocks.")} == {"0", "2"}
    assert "tok_emb.weight" in held and "head.weight" not in held  # stage 0 is here, stage 3 is not
    assert isinstance(rank0.blocks, StageBlocks) and [*rank0.blocks] == [*rank0.blocks.values()]
    first, second = stages
    assert [id(b) for b in first.blocks] == [id(rank0.blocks["0"])]
    assert [id(b) for b in second.blocks] == [id(rank0.blocks["2"])] and second.tok_emb is None
    assert find_blocks(second) == [rank0.blocks["2"]]  # one block is still the stage's sharding unit
    x = torch.randint(0, 65, (2, 16))
    hidden = first(x)
    assert hidden.shape == (2, 16, 32)  # no head on this stage: hidden states out
    rank1 = _gpt()
    middle, last = cut_model(rank1, layout, 1, "gpt")  # stages 1 and 3
    assert rank1.tok_emb is None and rank1.head is not None  # the rank's model holds what its stages need
    assert middle.head is None and last.head is rank1.head and isinstance(last, nn.Module)
    assert last(hidden).shape == (2, 16, 65)  # hidden states in, logits out


# -- wrong layouts from the command line: one line, exit 2, before any worker -----------------------------
CLI_ERRORS = [
    (["--parallel.nproc", "2", "--parallel.pp", "3"], "parallel.pp (3) must divide"),
    (["--parallel.nproc", "2", "--parallel.pp", "2", "--parallel.pp-microbatches", "1"], "would wait forever"),
    (["--parallel.nproc", "2", "--parallel.pp", "2", "--parallel.pp-microbatches", "3"], "does not divide"),
    (["--parallel.nproc", "2", "--parallel.pp", "2", "--parallel.pp-stages-per-rank", "3"], "6 stages"),
    (
        ["--parallel.nproc", "4", "--parallel.oversubscribe", "--parallel.pp", "2", "--parallel.strategy", "ddp"],
        "compose",
    ),
    (["--parallel.nproc", "2", "--parallel.pp", "2", "--precision.dtype", "fp16"], "fp16"),
]


@pytest.mark.parametrize(("extra", "says"), CLI_ERRORS)
def test_a_wrong_pipeline_on_the_command_line_is_one_line(
    small_text: Path, tmp_path: Path, extra: list[str], says: str
) -> None:
    proc = disttrain(*tiny_cli_args(small_text, 2, "--run.root", str(tmp_path), *extra), cwd=tmp_path, timeout=120)
    assert_one_line(proc, says)


# -- real processes against one process -------------------------------------------------------------------
def _job(data: Path, root: Path, name: str, micro: int, *extra: str) -> list[str]:
    """The 4-block GPT, batch 16 in micro-batches of ``micro`` (8: accumulation 2 at dp 1; 16: none)."""
    args = tiny_cli_args(data, STEPS, "--run.root", str(root), "--run.name", name, model=LAYERS)
    return [*args, "--train.micro-batch", str(micro), "--checkpoint.interval", "4", *extra]


def _ok(proc: object) -> None:
    assert getattr(proc, "returncode", None) == 0, getattr(proc, "stderr", "")[-3000:]


def _gap(got: dict[int, float], want: dict[int, float]) -> float:
    assert sorted(got) == sorted(want), (got, want)
    return max(abs(got[s] - want[s]) / abs(want[s]) for s in want)


SCHEDULES = [("gpipe", "1"), ("1f1b", "1"), ("interleaved-1f1b", "2"), ("zbv", "2")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> Path:
    """One process (with and without accumulation), each schedule at pp 2 with both, pp 2 x fsdp 2 and pp 2 x
    tp 2 on 4 ranks, and the clipping pair; every run saves a checkpoint at steps 4 and 8."""
    root = tmp_path_factory.mktemp("pipeline")
    jobs = [_job(small_text, root, f"single-m{m}", m, "--parallel.nproc", "1") for m in (8, 16)]
    for schedule, v in SCHEDULES:
        pp = ["--parallel.nproc", "2", "--parallel.pp", "2", "--parallel.pp-schedule", schedule]
        pp += ["--parallel.pp-stages-per-rank", v]
        jobs += [_job(small_text, root, f"{schedule}-m{m}", m, *pp) for m in (8, 16)]
    four = ["--parallel.nproc", "4", "--parallel.oversubscribe", "--parallel.pp", "2"]
    jobs += [_job(small_text, root, "pp-fsdp", 4, *four, "--parallel.strategy", "fsdp")]
    jobs += [_job(small_text, root, "pp-tp", 8, *four, "--parallel.tp", "2")]
    clip = ["--optim.grad-clip", "0.05"]
    jobs += [_job(small_text, root, "clip-single", 8, *clip, "--parallel.nproc", "1")]
    jobs += [_job(small_text, root, "clip-pp", 8, *clip, "--parallel.nproc", "2", "--parallel.pp", "2")]
    for proc in together(*(lambda j=j: disttrain(*j, cwd=root, timeout=300) for j in jobs), at_once=2):
        _ok(proc)
    return root


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("schedule", "micro"), [(s, m) for s, _ in SCHEDULES for m in (8, 16)])
def test_every_schedule_follows_one_process(runs: Path, schedule: str, micro: int) -> None:
    want = losses_by_step(runs / f"single-m{micro}")
    assert len(want) == STEPS
    assert _gap(losses_by_step(runs / f"{schedule}-m{micro}"), want) <= 1e-5


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["pp-fsdp", "pp-tp"])
def test_a_pipeline_composes_with_fsdp_and_tp(runs: Path, name: str) -> None:
    # pp-fsdp: 4 ranks = pp 2 x dp_shard 2, micro 4 -> accumulation 2 per data-parallel rank, the batch of 16
    assert _gap(losses_by_step(runs / name), losses_by_step(runs / "single-m8")) <= 1e-5


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_clipping_that_bites_clips_by_the_norm_over_every_stage(runs: Path) -> None:
    import json

    def norms(name: str) -> list[float]:
        recs = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
        return [r["grad_norm"] for r in recs if "grad_norm" in r]

    single, pp = norms("clip-single"), norms("clip-pp")
    assert min(single) > 0.05 * 4  # the clip bites at every step
    assert pp == pytest.approx(single, rel=1e-5)  # the global norm: every stage's gradients
    assert _gap(losses_by_step(runs / "clip-pp"), losses_by_step(runs / "clip-single")) <= 1e-6


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_checkpoints_move_between_a_pipeline_and_other_layouts(runs: Path, small_text: Path) -> None:
    """pp 2's step-4 checkpoint goes on as fsdp 2 and as one process; one process's goes on as pp 2: each
    follows the uninterrupted run (steps 5-8)."""
    want = losses_by_step(runs / "single-m8")
    pp4, one4 = runs / "1f1b-m8" / "checkpoints" / "step-00000004", runs / "single-m8" / "checkpoints" / "step-00000004"
    layouts = {
        "from-pp-fsdp": (pp4, ["--parallel.nproc", "2", "--parallel.strategy", "fsdp"]),
        "from-pp-single": (pp4, ["--parallel.nproc", "1"]),
        "from-single-pp": (one4, ["--parallel.nproc", "2", "--parallel.pp", "2"]),
    }
    jobs = [
        _job(small_text, runs, name, 8, "--checkpoint.resume", str(ck), *extra) for name, (ck, extra) in layouts.items()
    ]
    for proc in together(*(lambda j=j: disttrain(*j, cwd=runs, timeout=300) for j in jobs), at_once=2):
        _ok(proc)
    for name in layouts:
        got = losses_by_step(runs / name)
        assert sorted(got) == [5, 6, 7, 8], (name, got)
        for step, value in got.items():
            assert value == pytest.approx(want[step], rel=1e-6, abs=1e-6), (name, step)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_kill_under_a_pipeline_resumes_bitwise(runs: Path, small_text: Path) -> None:
    # a checkpoint every 2 steps: one is committed before rank 1 dies as step 8 starts, however slow the saves
    crash = _job(
        small_text, runs, "crash", 8, "--parallel.nproc", "2", "--parallel.pp", "2", "--checkpoint.interval", "2"
    )
    proc = disttrain(*crash, "--launch.max-restarts", "1", cwd=runs, env={"DISTTRAIN_FAULT": "step:8:1"}, timeout=300)
    _ok(proc)
    assert re.search(r"resumed from \S+step-0000000[246] \(step [246]", proc.stdout), proc.stdout
    assert losses_by_step(runs / "crash") == losses_by_step(runs / "1f1b-m8")  # bitwise
