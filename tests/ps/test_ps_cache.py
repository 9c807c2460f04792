"""The trainers' hot-row cache (bounded staleness) in one process, then in `disttrain ps` jobs: bound 0 is BSP
bit for bit, the default bound keeps the AUC, and a run killed mid-way resumes to the same losses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from disttrain.ps.cache import RowCache
from disttrain.testing.launch import together

from conftest import disttrain

DIM = 4


def filled(staleness: int, capacity: int = 3) -> RowCache:
    """A cache of a 10-row table whose hot rows (most read) are 1, 2 and 3."""
    cache = RowCache(10, DIM, capacity, staleness)
    for step, ids in enumerate([[1, 2, 3, 7], [1, 2, 3], [1, 2, 3, 8]]):
        cache.count(torch.tensor(ids), step)
    return cache


@pytest.mark.timeout(30)
def test_only_hot_rows_are_kept_and_never_more_than_the_capacity() -> None:
    cache = filled(staleness=2)
    ids = torch.tensor([1, 7, 2, 3, 9])
    kept = cache.admit(ids, torch.arange(5.0)[:, None].expand(5, DIM), step=3)
    assert kept.tolist() == [True, False, True, True, False]
    held, slots = cache.split(torch.tensor([9, 3, 1, 7]))
    assert held.tolist() == [False, True, True, False]
    assert cache.values[slots][:, 0].tolist() == [3.0, 0.0]  # the values pulled for rows 3 and 1
    again = cache.admit(torch.tensor([1]), torch.full((1, DIM), 5.0), step=3)  # full: nothing more is kept
    assert not again.any() and int((cache.ids >= 0).sum()) == 3


@pytest.mark.timeout(30)
@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_a_row_is_read_for_staleness_plus_one_steps_then_pushed_with_its_summed_gradients(staleness: int) -> None:
    cache = filled(staleness)
    cache.admit(torch.tensor([2]), torch.zeros(1, DIM), step=5)
    slot = cache.slot_of[torch.tensor([2])]
    pushed = []
    for step in range(5, 5 + staleness + 1):
        cache.add_grads(slot, torch.full((1, DIM), float(step)))
        ids, grads = cache.expire(step)
        pushed.append((step, ids.tolist(), grads[:, 0].tolist()))
    last = 5 + staleness
    total = float(sum(range(5, last + 1)))
    assert pushed == [(s, [], []) for s in range(5, last)] + [(last, [2], [total])]
    assert cache.slot_of[2] == -1  # pulled again the next time it is read


@pytest.mark.timeout(30)
def test_a_sync_point_pushes_every_row_at_once() -> None:
    cache = filled(staleness=5)
    cache.admit(torch.tensor([1, 3]), torch.zeros(2, DIM), step=3)
    cache.add_grads(cache.slot_of[torch.tensor([3, 1])], torch.ones(2, DIM))
    assert cache.expire(4)[0].numel() == 0
    ids, grads = cache.expire(4, flush=True)
    assert sorted(ids.tolist()) == [1, 3] and torch.equal(grads, torch.ones(2, DIM))
    assert int((cache.ids >= 0).sum()) == 0


# -- in jobs: 2 trainers x 2 servers (colocated), small tables, every row hot ---------------------------------
JOB = [
    "--ps.tables",
    "2000",
    "500",
    "50",
    "--ps.dim",
    "8",
    "--ps.hidden",
    "16",
    "--train.batch",
    "64",
    "--train.eval-samples",
    "4000",
    "--ps.dense-lr",
    "0.01",
    "--ps.cache-rows",
    "512",
]


def ps_run(tmp: Path, name: str, *args: str, env: dict[str, str] | None = None) -> tuple[list[tuple[int, float]], dict]:
    """(step, loss) of every logged step, and the summary."""
    proc = disttrain("ps", *JOB, "--run.root", str(tmp), "--run.name", name, *args, timeout=200, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run = tmp / name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records], json.loads((run / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_bound_0_is_bsp_bit_for_bit_and_the_default_bound_keeps_the_auc(tmp_path: Path) -> None:
    steps = ["--train.steps", "150", "--train.eval-interval", "0"]
    (plain, ref), (bound0, _), (bound2, cached), (overlap, lapped) = together(
        lambda: ps_run(tmp_path, "plain", *steps, "--ps.cache-rows", "0", "--ps.overlap", "off"),
        lambda: ps_run(tmp_path, "bound0", *steps, "--ps.cache-staleness", "0"),
        lambda: ps_run(tmp_path, "bound2", *steps, "--ps.cache-staleness", "2"),
        lambda: ps_run(tmp_path, "overlap", *steps, "--ps.cache-rows", "0", "--ps.overlap", "on"),
    )
    assert bound0 == plain  # every logged loss, bit for bit
    assert bound2 != plain  # the cache did serve rows
    assert cached["cache_hit_rate"] > 0.3, cached["cache_hit_rate"]
    assert cached["final"]["auc"] == pytest.approx(ref["final"]["auc"], abs=0.002)
    assert cached["bytes_per_step"] < ref["bytes_per_step"]
    assert overlap != plain and [s for s, _ in overlap] == list(range(1, 151))  # every step logged once, in order
    assert lapped["max_staleness"] == 1
    # 150 short steps feel one step of staleness most; the default job's gap is in bench_ps's baseline part (<= 0.003)
    assert lapped["final"]["auc"] == pytest.approx(ref["final"]["auc"], abs=0.005)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_run_with_a_cache_or_overlapped_resumes_to_the_same_losses(tmp_path: Path) -> None:
    """Process 1 (trainer 1 and server 1) is killed as it applies the 5th (cache: tables are pushed to less
    often than every step, cached rows wait) or 6th (overlapped) update of a table; the job restarts from the
    checkpoint of step 4, where every cached gradient had reached the servers (with the same hot rows as
    before), or where the overlapped steps had caught up."""
    job = ["--train.steps", "12", "--train.eval-interval", "0", "--checkpoint.interval", "4"]
    lap = ["--ps.cache-rows", "0", "--ps.overlap", "on"]
    restart = ["--launch.max-restarts", "1"]
    (clean, _), (killed, _), (lap_clean, _), (lap_killed, _) = together(
        lambda: ps_run(tmp_path, "clean", *job),
        lambda: ps_run(tmp_path, "killed", *job, *restart, env={"DISTTRAIN_FAULT": "ps_server_kill:5:1"}),
        lambda: ps_run(tmp_path, "lap-clean", *job, *lap),
        lambda: ps_run(tmp_path, "lap-killed", *job, *lap, *restart, env={"DISTTRAIN_FAULT": "ps_server_kill:6:1"}),
    )
    for name, run, ref in (("killed", killed, clean), ("lap-killed", lap_killed, lap_clean)):
        events = (tmp_path / name / "health" / "events.jsonl").read_text()
        assert '"event": "ps_resume"' in events and '"step": 4' in events, events  # restarted after step 4
        assert [s for s, _ in run][-8:] == list(range(5, 13)), run
        assert run[-8:] == ref[4:]  # bit for bit
