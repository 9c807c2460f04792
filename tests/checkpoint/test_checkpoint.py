"""Checkpoints: exact resume after kill -9, load on another world size / strategy, crashes during a save,
corrupt files skipped, keep-k purge. Faults are injected on purpose (DISTTRAIN_FAULT, see disttrain.testing.faults)."""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from disttrain.checkpoint import CheckpointManager, ModelOptimState, inspect_folder, list_checkpoints
from disttrain.config import CheckpointConfig
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.testing.launch import together
from disttrain.testing.tiny import tiny_cli_args, tiny_config

from conftest import disttrain, losses_by_step, run_scenario

pytestmark = pytest.mark.timeout(400)


def tiny_args(data: Path, root: Path, name: str, *extra: str) -> list[str]:
    """The tiny job for 12 steps with a checkpoint every 4, in ``root/name``."""
    where = ["--checkpoint.interval", "4", "--run.root", str(root), "--run.name", name]
    return tiny_cli_args(data, 12, *where, *extra)


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> Path:
    """The plain 12-step job of tiny_args (checkpoints at 4, 8, 12), run once: the trajectory a restarted job must
    reproduce, the run a failing load resumes (a copy of it), the from-scratch start a seed checkpoint must change."""
    root = tmp_path_factory.mktemp("ckpt-ref")
    ref = disttrain(*tiny_args(small_text, root, "r"), cwd=root)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert sorted(losses_by_step(root / "r")) == list(range(1, 13))
    return root / "r"


@pytest.mark.slow
def test_kill9_restart_resumes_the_exact_trajectory(tmp_path: Path, small_text: Path, ref_run: Path) -> None:
    crash = disttrain(
        *tiny_args(small_text, tmp_path, "crash", "--launch.max-restarts", "1"),
        cwd=tmp_path,
        env={"DISTTRAIN_FAULT": "step:11:1"},  # SIGKILL rank 1 as it starts step 11 (first attempt only)
    )
    assert crash.returncode == 0, crash.stderr[-3000:]
    # the async save of step 8 may still be in flight at step 11 (then it is lost, never half-committed)
    m = re.search(r"resumed from \S+step-(\d{8}) \(step (\d+), sample (\d+)\)", crash.stdout)
    assert m, crash.stdout
    assert int(m.group(1)) in (4, 8) and int(m.group(3)) == int(m.group(2)) * 16
    want, got = losses_by_step(ref_run), losses_by_step(tmp_path / "crash")
    assert sorted(got) == list(range(1, 13))
    assert got == want  # bitwise: fp32 on CPU, same data order, same optimizer and scheduler state
    # the run folder's failure log names the killed rank and where the restart resumed (disttrain.health)
    log = [json.loads(x) for x in (tmp_path / "crash" / "health" / "events.jsonl").read_text().splitlines()]
    log = [e for e in log if e["event"] != "checkpoint"]  # one per save, for the report's save times
    assert [e["event"] for e in log] == ["restart"] and log[0]["resumed_from"] == int(m.group(1))
    assert log[0]["cause"].startswith("rank 1 at step") and "stopped without an error" in log[0]["cause"]


CRASHES = [("off", "before_shards:8:1"), ("thread", "after_shards:8:0"), ("off", "before_marker:8:0")]


def crash_then_resume(tmp: Path, small_text: Path, mode: str, fault: str) -> tuple[Any, list[int], Any]:
    """A job killed by ``fault`` while saving at step 8, then the same command again: (the killed run, the usable
    checkpoints it left, the run that resumed)."""
    args = tiny_args(small_text, tmp, "r", "--checkpoint.async-mode", mode)
    first = disttrain(*args, cwd=tmp, env={"DISTTRAIN_FAULT": fault})
    folder = tmp / "r" / "checkpoints"
    usable = [i.step for i in list_checkpoints(folder) if i.usable]
    return first, usable, disttrain(*args, cwd=tmp)


@pytest.fixture(scope="module")
def crashes(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> dict[str, tuple[Any, list[int], Any]]:
    """Every crash of CRASHES in a folder of its own, all at once (independent jobs; nothing here is timed)."""
    folders = [tmp_path_factory.mktemp("crash") for _ in CRASHES]
    runs = together(
        *(functools.partial(crash_then_resume, f, small_text, m, x) for f, (m, x) in zip(folders, CRASHES, strict=True))
    )
    return {f"{m}-{x}": r for (m, x), r in zip(CRASHES, runs, strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "fault"), CRASHES)
def test_crash_during_a_save_leaves_the_previous_checkpoint(
    crashes: dict[str, tuple[Any, list[int], Any]], mode: str, fault: str
) -> None:
    first, usable, again = crashes[f"{mode}-{fault}"]
    assert first.returncode != 0
    assert usable == [4], usable
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout and "step-00000004" in again.stdout


def run_with_failed_save_at_8(tmp_path: Path, small_text: Path, mode: str, fault: str) -> tuple[str, list[Any]]:
    """A 12-step job saving every 4 steps whose save at step 8 fails (``fault``): it must report that save, train
    to the end, and leave steps 4 and 12 as the usable checkpoints. Returns its stdout and the checkpoints."""
    args = tiny_args(small_text, tmp_path, "r", "--checkpoint.async-mode", mode, "--checkpoint.keep-latest", "5")
    proc = disttrain(*args, cwd=tmp_path, env={"DISTTRAIN_FAULT": fault})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoint at step 8 failed and was not committed" in proc.stdout, proc.stdout[-3000:]
    assert sorted(losses_by_step(tmp_path / "r")) == list(range(1, 13))  # training ran to the end
    infos = list_checkpoints(tmp_path / "r" / "checkpoints", checksums=True)
    assert [i.step for i in infos if i.usable] == [4, 12], [(i.path.name, i.problem) for i in infos]
    return proc.stdout, infos


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_failing_background_save_is_reported_and_training_goes_on(tmp_path: Path, small_text: Path) -> None:
    # rank 1's shard write at step 8 raises an I/O error (a disk error, not a dead peer) in the background
    stdout, infos = run_with_failed_save_at_8(tmp_path, small_text, "thread", "write_error:8:1")
    assert "injected I/O error" in stdout
    folder = tmp_path / "r" / "checkpoints"
    assert not (folder / "step-00000008").exists()  # never renamed, never marked complete
    for info in infos:  # the ranks' checksum sidecars were merged into the manifest and removed
        assert not (info.path / ".checksums").exists()
        assert info.manifest is not None and {"rng/rank0.pt", "rng/rank1.pt", ".metadata"} <= set(
            info.manifest["files"]
        )


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.timing
def test_a_dead_background_save_process_is_replaced_at_the_next_save(tmp_path: Path, small_text: Path) -> None:
    # async_mode=process: rank 0's DCP save process is SIGKILLed just before the save at step 8. That save fails on
    # both ranks (rank 1's save process loses its peer); training goes on, and the save at step 12 starts new save
    # processes on every rank and commits.
    stdout, _ = run_with_failed_save_at_8(tmp_path, small_text, "process", "kill_save_process:8:0")
    assert "the next save starts a new background save process" in stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_load_failing_on_one_rank_stops_every_rank_naming_it(tmp_path: Path, small_text: Path, ref_run: Path) -> None:
    # Ranks plan and read a checkpoint on their own: a read error on rank 1 alone must still stop both ranks
    # with one clear error (no hang of rank 0 in the first training collective, no torch traceback).
    args = tiny_args(small_text, tmp_path, "r")
    shutil.copytree(ref_run, tmp_path / "r")  # the finished 12-step run of these args, to go on from
    proc = disttrain(*args, "--train.steps", "16", cwd=tmp_path, env={"DISTTRAIN_FAULT": "read_error:12:1"})
    assert proc.returncode != 0
    err = proc.stderr
    assert "disttrain: error:" in err and "step-00000012: loading failed (rank 1: " in err, err[-3000:]
    assert "injected I/O error" in err and "rank 0:" not in err and "Traceback" not in err, err[-3000:]
    assert max(losses_by_step(tmp_path / "r")) == 12  # nothing trained after the failed load


# -- resharding: 4-rank FSDP -> 2-rank FSDP, 1 process, 2-rank DDP; DDP -> FSDP -------------------------
@pytest.fixture(scope="module")
def reshard(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("reshard")

    def spec(name: str, strategy: str, micro: int, folder: Path, resume: str | None = None) -> dict[str, Any]:
        """Train 6 steps and save (resume=None), or load ``resume`` and train on to step 8 without saving."""
        cfg = tiny_config(small_text, parallel={"strategy": strategy}, train={"micro_batch": micro})
        if resume is None:
            cfg["train"]["steps"] = 6
            cfg["checkpoint"] = {"interval": 0, "resume": "never", "save_final": "full"}
        else:
            cfg["train"]["steps"] = 8
            cfg["checkpoint"] = {"interval": 0, "resume": resume, "save_final": "none"}
        return {
            "name": name,
            "config": cfg,
            "ckpt_folder": str(folder),
            "probe": "after_fit" if resume is None else "after_resume",
        }

    f4, f2 = tmp / "fsdp4", tmp / "ddp2"
    from4 = str(f4 / "step-00000006")
    out = {"fsdp4": run_scenario(tmp, "save4", 4, [spec("save", "fsdp", 4, f4)])}
    out["ddp2"], out["single"] = together(
        lambda: run_scenario(tmp, "ddp2", 2, [spec("load4", "ddp", 8, f2, resume=from4), spec("save", "ddp", 8, f2)]),
        lambda: run_scenario(tmp, "single", 1, [spec("load4", "single", 8, tmp / "z", resume=from4)]),
    )
    out["fsdp2"] = run_scenario(
        tmp,
        "fsdp2",
        2,
        [
            spec("load4", "fsdp", 8, tmp / "x", resume=from4),
            spec("load_ddp", "fsdp", 8, tmp / "y", resume=str(f2 / "step-00000006")),
        ],
    )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("target", ["fsdp2", "single", "ddp2"])
def test_fsdp4_checkpoint_loads_on_other_world_sizes_and_strategies(reshard: dict[str, Any], target: str) -> None:
    saved = reshard["fsdp4"][0]["save"]["probe"]
    for rank_result in reshard[target]:
        got = rank_result["load4"]["probe"]
        assert got["step"] == 6 and got["position"] == 6 * 16  # continues over the samples not yet seen
        assert got["fixed_loss"] == pytest.approx(saved["fixed_loss"], rel=1e-6, abs=1e-7)
        assert got["lr"] == pytest.approx(saved["lr"])
        assert got["optim"].keys() == saved["optim"].keys() and len(saved["optim"]) > 10
        for k, v in saved["optim"].items():
            assert got["optim"][k] == pytest.approx(v, rel=1e-5, abs=1e-8), k
        assert rank_result["load4"]["start_step"] == 6 and len(rank_result["load4"]["losses"]) == 2


@pytest.mark.slow
def test_training_continues_identically_whatever_the_world_size(reshard: dict[str, Any]) -> None:
    ref = torch.tensor(reshard["single"][0]["load4"]["losses"])
    for target in ("fsdp2", "ddp2"):
        assert_close(torch.tensor(reshard[target][0]["load4"]["losses"]), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_ddp_checkpoint_loads_into_fsdp(reshard: dict[str, Any]) -> None:
    saved = reshard["ddp2"][0]["save"]["probe"]
    got = reshard["fsdp2"][0]["load_ddp"]["probe"]
    assert got["fixed_loss"] == pytest.approx(saved["fixed_loss"], rel=1e-6, abs=1e-7)
    for k, v in saved["optim"].items():
        assert got["optim"][k] == pytest.approx(v, rel=1e-5, abs=1e-8), k


# -- one process, no process group: corrupt files, purge ----------------------------------------------
def make_checkpoints(folder: Path, steps: list[int], keep: int = 2) -> tuple[CheckpointManager, GPT]:
    model = GPT(GPTConfig(vocab_size=20, n_layers=1, d_model=16, n_heads=2, context=8))
    opt = torch.optim.AdamW(model.parameters())
    mgr = CheckpointManager(folder, CheckpointConfig(async_mode="off", keep_latest=keep))
    for s in steps:
        model(torch.randint(0, 20, (2, 8))).sum().backward()
        opt.step()
        mgr.save(s, {"app": ModelOptimState(model, opt)})
    mgr.close()
    return mgr, model


def test_every_save_holds_its_own_state_while_the_save_plan_is_cached(tmp_path: Path) -> None:
    # The manager reuses DCP's cached save plan after the first save: each checkpoint must still hold the state
    # of its own step, including when the state's structure changes (no Adam moments at step 0, an extra entry).
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, n_layers=1, d_model=16, n_heads=2, context=8))
    opt = torch.optim.AdamW(model.parameters())
    mgr = CheckpointManager(tmp_path, CheckpointConfig(async_mode="off", keep_latest=10))
    expected: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for step in range(5):
        if step:
            model(torch.randint(0, 20, (2, 8))).sum().backward()
            opt.step()
            opt.zero_grad()
        state: dict[str, Any] = {"app": ModelOptimState(model, opt)}
        if step == 2:
            state["extra"] = {"x": torch.full((3,), 7.0)}
        mgr.save(step, state)
        expected[step] = (
            {k: v.clone() for k, v in model.state_dict().items()},
            {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state_dict()["state"].items()},
        )
    mgr.close()
    for step, (params, moments) in expected.items():
        fresh = GPT(GPTConfig(vocab_size=20, n_layers=1, d_model=16, n_heads=2, context=8))
        fresh_opt = torch.optim.AdamW(fresh.parameters())
        if step:  # the optimizer must have state for DCP to load into
            fresh(torch.randint(0, 20, (2, 8))).sum().backward()
            fresh_opt.step()
        target: dict[str, Any] = {"app": ModelOptimState(fresh, fresh_opt)}
        if step == 2:
            target["extra"] = {"x": torch.zeros(3)}
        info = mgr.resolve(str(step))
        assert info is not None and info.usable, step
        mgr.load(target, info)
        assert_close(fresh.state_dict(), params, rtol=0, atol=0)
        assert_close(fresh_opt.state_dict()["state"], moments, rtol=0, atol=0)
        if step == 2:
            assert_close(target["extra"]["x"], torch.full((3,), 7.0))


def test_keep_latest_purges_exactly_the_old_ones(tmp_path: Path) -> None:
    mgr, _ = make_checkpoints(tmp_path, [1, 2, 3, 4, 5], keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]
    (tmp_path / ".tmp-step-00000003").mkdir()  # an old unfinished save: purged
    (tmp_path / ".tmp-step-00000009").mkdir()  # a newer unfinished one: kept (it may still be running)
    shutil.rmtree(tmp_path / "step-00000005" / "rng")  # the newest is now broken: step 4 must survive
    mgr.purge()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-step-00000009", "step-00000004", "step-00000005"]


def test_corrupt_checkpoints_are_detected_and_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mgr, _ = make_checkpoints(tmp_path, [1, 2, 3, 4], keep=10)
    shard = next((tmp_path / "step-00000004").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated shard
    (tmp_path / "step-00000003" / ".metadata").unlink()  # missing metadata
    for p in (tmp_path / "step-00000002").iterdir():  # commit marker without files
        if p.name != "COMMITTED":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    problems = {i.step: i.problem for i in list_checkpoints(tmp_path)}
    assert "bytes, expected" in problems[4]
    assert problems[3] == ".metadata is missing"
    assert "manifest.json unreadable" in problems[2]
    assert problems[1] is None
    info = mgr.latest()
    assert info is not None and info.step == 1
    warned = capsys.readouterr().out
    assert "skipping checkpoint" in warned and "step-00000004" in warned and "step-00000003" in warned


def test_flipped_byte_fails_the_checksum(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, [1], keep=2)
    shard = next((tmp_path / "step-00000001").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert inspect_folder(tmp_path / "step-00000001").problem is None  # sizes alone cannot see it
    assert "CRC32" in (inspect_folder(tmp_path / "step-00000001", checksums=True).problem or "")


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {_Evil.marker}",))

    marker = ""


def test_malicious_metadata_is_refused_not_run(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, [1], keep=2)
    ckpt = tmp_path / "step-00000001"
    _Evil.marker = str(tmp_path / "pwned")
    evil = pickle.dumps(_Evil())
    (ckpt / ".metadata").write_bytes(evil)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][".metadata"]["size"] = len(evil)
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    info = inspect_folder(ckpt)
    assert (info.problem is not None and "posix.system" in info.problem) or "os.system" in (info.problem or "")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_seed_checkpoint_starts_runs_of_any_world_size(tmp_path: Path, small_text: Path, ref_run: Path) -> None:
    def run(name: str, *extra: str) -> list[float]:
        proc = disttrain(*tiny_args(small_text, tmp_path, name, "--train.steps", "3", *extra), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [v for _, v in sorted(losses_by_step(tmp_path / name).items())]

    seed = disttrain(*tiny_args(small_text, tmp_path, "seed", "--checkpoint.create-seed", "--train.seed", "99"))
    assert seed.returncode == 0, seed.stderr[-3000:]
    assert "seed checkpoint:" in seed.stdout and "single on 1 cpu process(es)" in seed.stdout
    path = str(tmp_path / "seed" / "checkpoints" / "step-00000000")
    fsdp, ddp = together(
        lambda: run("fsdp", "--checkpoint.resume", path, "--parallel.strategy", "fsdp"),
        lambda: run("ddp", "--checkpoint.resume", path, "--parallel.strategy", "ddp"),
    )
    scratch = losses_by_step(ref_run)[1]  # step 1 of the same job from scratch (default seed)
    assert_close(torch.tensor(fsdp), torch.tensor(ddp), rtol=1e-5, atol=1e-5)
    assert fsdp[0] != pytest.approx(scratch, abs=1e-4)  # the weights came from the seed (train.seed 99)


@pytest.mark.slow
def test_process_async_mode_and_model_only_final_save(tmp_path: Path, small_text: Path) -> None:
    extra = [
        "--checkpoint.async-mode",
        "process",
        "--checkpoint.save-final",
        "model_only",
        "--checkpoint.export-dtype",
        "bf16",
        "--parallel.strategy",
        "fsdp",
    ]
    proc = disttrain(*tiny_args(small_text, tmp_path, "p", *extra), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert [i.step for i in list_checkpoints(tmp_path / "p" / "checkpoints") if i.usable] == [4, 8]
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "p" / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    vocab = weights["tok_emb.weight"].shape[0]
    model = GPT(GPTConfig(vocab_size=vocab, n_layers=2, d_model=64, n_heads=4, context=32))
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
