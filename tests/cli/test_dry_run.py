"""`disttrain run --dry-run`: a 32-rank HSDP x TP layout built for one rank on the fake backend and the meta
device, its shards against the plan's figures; bad input is one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import assert_one_line, disttrain

pytestmark = pytest.mark.timeout(240)

LAYOUT = ["--parallel.nproc", "8", "--launch.nnodes", "4", "--parallel.tp", "2", "--parallel.strategy", "hsdp"]
SHAPE = ["--model.n-layers", "4", "--model.d-model", "128", "--model.n-heads", "4", "--model.context", "64"]


def bytes_of(text: str, row: str) -> tuple[str, str]:
    m = re.search(rf"^  {row}\s+(\S+ \S+)\s+(\S+ \S+)$", text, re.M)
    assert m, text
    return m.group(1), m.group(2)


def test_a_32_rank_layout_is_built_for_one_rank_and_agrees_with_the_plan(small_text: Path, tmp_path: Path) -> None:
    outs = []
    for rank in ("0", "31"):
        args = ["--data.path", str(small_text), *LAYOUT, *SHAPE, "--dry-run", "--dry-run-rank", rank]
        proc = disttrain("run", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(proc.stdout)
    first, last = outs
    assert "hsdp (4 replicas x 4 shards) x tp 2 over 32 ranks, as rank 31" in last, last
    assert "mesh: dp_replicate 4 x dp_shard 4 x tp 2" in first
    steps = "tp 2 (the gpt plan, sequence parallel, loss parallel) -> hsdp over dp_replicate 4 x dp_shard 4"
    assert f"parallelize (gpt model): {steps}" in first, first
    assert "dp_shard (4) splits 100.0% of the parameters" in first and "tp (2) splits" in first
    for text in outs:
        gap = re.search(r"the plan's parameter bytes per rank and the shards built agree \((\d+\.\d+)% apart\)", text)
        assert gap and float(gap.group(1)) <= 1.0, text
        built, planned = bytes_of(text, "params")  # an uneven shard (the last ranks') is a little smaller
        assert built.endswith("KiB") and planned.endswith("KiB"), text
    assert "an all-reduce across the 4 replicas" in first and "layers split over 2 ranks" in first
    assert "as planned:" in first and "collective calls" in first
    assert not list(tmp_path.iterdir()), "a dry run writes no run folder"


def test_a_rank_outside_the_world_is_one_line(small_text: Path) -> None:
    proc = disttrain("run", "--data.path", str(small_text), *LAYOUT, "--dry-run", "--dry-run-rank", "32")
    assert_one_line(proc, "--dry-run-rank must be a rank of the 32 (8 x 4), got 32")
    proc = disttrain("run", "--data.path", str(small_text), *LAYOUT, "--dry-run", "--dry-run-rank", "last")
    assert_one_line(proc, "--dry-run-rank takes a rank number, got 'last'")
