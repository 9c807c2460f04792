"""Checkpoints: exact resume after kill -9, load on another world size / strategy, crashes during a save,
corrupt files skipped, keep-k purge. Faults are injected on purpose (DISTTRAIN_FAULT, see checkpoint.py)."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from disttrain.checkpoint import CheckpointManager, ModelOptimState, inspect_folder, list_checkpoints
from disttrain.config import CheckpointConfig
from disttrain.models.gpt import GPT, GPTConfig

from conftest import disttrain, run_scenario, tiny_config

pytestmark = pytest.mark.timeout(400)


def tiny_args(data: Path, root: Path, name: str, *extra: str) -> list[str]:
    return [
        "run", "--data.path", str(data), "--model.n-layers", "2", "--model.d-model", "64", "--model.n-heads", "4",
        "--model.context", "32", "--train.steps", "12", "--train.global-batch", "16", "--train.micro-batch", "8",
        "--train.eval-interval", "0", "--train.generate-chars", "0", "--precision.dtype", "fp32",
        "--metrics.log-interval", "1", "--metrics.peak-tflops", "1", "--checkpoint.interval", "4",
        "--run.root", str(root), "--run.name", name, *extra,
    ]  # fmt: skip


def losses_by_step(run: Path) -> dict[int, float]:
    """The last loss logged for each step (a restarted job logs the replayed steps again)."""
    out: dict[int, float] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


@pytest.mark.slow
def test_kill9_restart_resumes_the_exact_trajectory(tmp_path: Path, small_text: Path) -> None:
    ref = disttrain(*tiny_args(small_text, tmp_path, "ref"), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
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
    want, got = losses_by_step(tmp_path / "ref"), losses_by_step(tmp_path / "crash")
    assert sorted(got) == list(range(1, 13))
    assert got == want  # bitwise: fp32 on CPU, same data order, same optimizer and scheduler state
    # the run folder's failure log names the killed rank and where the restart resumed (disttrain.health)
    log = [json.loads(x) for x in (tmp_path / "crash" / "health" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in log] == ["restart"] and log[0]["resumed_from"] == int(m.group(1))
    assert log[0]["cause"].startswith("rank 1 at step") and "stopped without an error" in log[0]["cause"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "fault"),
    [("off", "before_shards:8:1"), ("thread", "after_shards:8:0"), ("off", "before_marker:8:0")],
)
def test_crash_during_a_save_leaves_the_previous_checkpoint(
    tmp_path: Path, small_text: Path, mode: str, fault: str
) -> None:
    args = tiny_args(small_text, tmp_path, "r", "--checkpoint.async-mode", mode)
    first = disttrain(*args, cwd=tmp_path, env={"DISTTRAIN_FAULT": fault})
    assert first.returncode != 0
    folder = tmp_path / "r" / "checkpoints"
    usable = [i.step for i in list_checkpoints(folder) if i.usable]
    assert usable == [4], [(i.path.name, i.problem) for i in list_checkpoints(folder)]
    again = disttrain(*args, cwd=tmp_path)
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
def test_a_dead_background_save_process_is_replaced_at_the_next_save(tmp_path: Path, small_text: Path) -> None:
    # async_mode=process: rank 0's DCP save process is SIGKILLed just before the save at step 8. That save fails on
    # both ranks (rank 1's save process loses its peer); training goes on, and the save at step 12 starts new save
    # processes on every rank and commits.
    stdout, _ = run_with_failed_save_at_8(tmp_path, small_text, "process", "kill_save_process:8:0")
    assert "the next save starts a new background save process" in stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_load_failing_on_one_rank_stops_every_rank_naming_it(tmp_path: Path, small_text: Path) -> None:
    # Ranks plan and read a checkpoint on their own: a read error on rank 1 alone must still stop both ranks
    # with one clear error (no hang of rank 0 in the first training collective, no torch traceback).
    args = tiny_args(small_text, tmp_path, "r")
    assert disttrain(*args, cwd=tmp_path).returncode == 0
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
        return {"name": name, "config": cfg, "ckpt_folder": str(folder),
                "probe": "after_fit" if resume is None else "after_resume"}  # fmt: skip

    f4, f2 = tmp / "fsdp4", tmp / "ddp2"
    from4 = str(f4 / "step-00000006")
    out = {"fsdp4": run_scenario(tmp, "save4", 4, [spec("save", "fsdp", 4, f4)])}
    out["ddp2"] = run_scenario(tmp, "ddp2", 2, [spec("load4", "ddp", 8, f2, resume=from4), spec("save", "ddp", 8, f2)])
    out["fsdp2"] = run_scenario(
        tmp,
        "fsdp2",
        2,
        [spec("load4", "fsdp", 8, tmp / "x", resume=from4),
         spec("load_ddp", "fsdp", 8, tmp / "y", resume=str(f2 / "step-00000006"))],
    )  # fmt: skip
    out["single"] = run_scenario(tmp, "single", 1, [spec("load4", "single", 8, tmp / "z", resume=from4)])
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


def test_model_optim_state_equals_get_state_dict_across_saves_and_replaced_parameters() -> None:
    # ModelOptimState keeps get_state_dict's analysis of the model between saves; it must give what
    # get_state_dict gives, also after a parameter object is replaced (in the model and the optimizer).
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    def check(ours: dict[str, Any]) -> None:
        msd, osd = get_state_dict(model, opt)
        assert ours["model"].keys() == msd.keys() and all(torch.equal(ours["model"][k], msd[k]) for k in msd)
        assert ours["optim"]["state"].keys() == osd["state"].keys()
        for fqn, st in osd["state"].items():
            assert all(torch.equal(ours["optim"]["state"][fqn][k], v) for k, v in st.items())
        assert ours["optim"]["param_groups"] == osd["param_groups"]

    state = ModelOptimState(model, opt)
    step()
    check(state.state_dict())
    step()
    check(state.state_dict())  # from the kept analysis
    new_weight = nn.Parameter(model[2].weight.detach() * 2)
    old_weight, model[2].weight = model[2].weight, new_weight
    opt.param_groups[0]["params"][2] = new_weight
    opt.state[new_weight] = opt.state.pop(old_weight)
    step()
    check(state.state_dict())  # made again for the new parameter


def test_staging_copies_the_state_into_reused_buffers_sharing_what_the_source_shares() -> None:
    # The async save's copy of the state: equal values, never aliasing the live tensors, views of one storage
    # staying views of one staged storage, containers and leaves kept, the same buffers reused by the next save.
    import io

    from disttrain.checkpoint.manager import _BatchedCopyStager

    base = torch.arange(12.0)
    state: dict[str, Any] = {
        "w": torch.randn(4, 3),
        "t": torch.randn(3, 5).t(),
        "view_a": base[2:6],
        "view_b": base.view(3, 4),
        "groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["w", "t"], "dtype": torch.bfloat16}],
        "blob": io.BytesIO(b"rng"),  # anything else: DCP's own deep copy
    }
    stager = _BatchedCopyStager(share_memory=False)
    staged = stager.stage(state)
    for key in ("w", "t", "view_a", "view_b"):
        assert torch.equal(staged[key], state[key]) and staged[key].stride() == state[key].stride()
        assert staged[key].untyped_storage().data_ptr() != state[key].untyped_storage().data_ptr()
    assert staged["view_a"].untyped_storage().data_ptr() == staged["view_b"].untyped_storage().data_ptr()
    assert staged["groups"] == state["groups"] and staged["groups"] is not state["groups"]
    assert type(staged["groups"][0]["betas"]) is tuple
    assert staged["blob"].getvalue() == b"rng" and staged["blob"] is not state["blob"]
    state["w"].add_(1.0)
    again = stager.stage(state)
    assert torch.equal(again["w"], state["w"])
    assert again["w"].untyped_storage().data_ptr() == staged["w"].untyped_storage().data_ptr()  # buffers reused


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
def test_seed_checkpoint_starts_runs_of_any_world_size(tmp_path: Path, small_text: Path) -> None:
    def run(name: str, *extra: str) -> list[float]:
        proc = disttrain(*tiny_args(small_text, tmp_path, name, "--train.steps", "3", *extra), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [v for _, v in sorted(losses_by_step(tmp_path / name).items())]

    seed = disttrain(*tiny_args(small_text, tmp_path, "seed", "--checkpoint.create-seed", "--train.seed", "99"))
    assert seed.returncode == 0, seed.stderr[-3000:]
    assert "seed checkpoint:" in seed.stdout and "single on 1 cpu process(es)" in seed.stdout
    path = str(tmp_path / "seed" / "checkpoints" / "step-00000000")
    fsdp = run("fsdp", "--checkpoint.resume", path, "--parallel.strategy", "fsdp")
    ddp = run("ddp", "--checkpoint.resume", path, "--parallel.strategy", "ddp")
    scratch = run("scratch", "--parallel.strategy", "ddp")
    assert_close(torch.tensor(fsdp), torch.tensor(ddp), rtol=1e-5, atol=1e-5)
    assert fsdp[0] != pytest.approx(scratch[0], abs=1e-4)  # the weights came from the seed (train.seed 99)


@pytest.mark.slow
def test_process_async_mode_and_model_only_final_save(tmp_path: Path, small_text: Path) -> None:
    extra = ["--checkpoint.async-mode", "process", "--checkpoint.save-final", "model_only",
             "--checkpoint.export-dtype", "bf16", "--parallel.strategy", "fsdp"]  # fmt: skip
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


@pytest.mark.parametrize(
    "tensor",
    [torch.arange(1000.0), torch.randn(3, 4, 5).bfloat16(), torch.tensor(3), torch.zeros(0), torch.ones(7).long()],
    ids=["fp32", "bf16-3d", "scalar", "empty", "int64"],
)
def test_tensor_data_is_found_from_the_zip_head_alone(tensor: torch.Tensor) -> None:
    # The loader finds a shard tensor's raw bytes from the first 4 KiB of its torch.save zip, without the central
    # directory: the same offset the zip's own index gives, and the same bytes.
    import io

    from disttrain.checkpoint.reader import _raw_tensor_data_from_head

    buf = io.BytesIO()
    torch.save(tensor, buf)
    data = buf.getvalue()
    found = _raw_tensor_data_from_head(data[:4096], len(data), tensor.dtype, tuple(tensor.shape))
    assert found is not None
    offset, nbytes = found
    assert offset == torch._C.PyTorchFileReader(io.BytesIO(data)).get_record_offset("data/0")
    assert data[offset : offset + nbytes] == tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    assert nbytes == tensor.numel() * tensor.element_size()
    # anything not exactly as expected is left to DCP's own path
    assert _raw_tensor_data_from_head(data[:4096], len(data), torch.float64, tuple(tensor.shape)) is None
    view = io.BytesIO()
    torch.save(torch.arange(10.0)[2:], view)  # a view into a larger storage: not one plain tensor
    assert _raw_tensor_data_from_head(view.getvalue(), len(view.getvalue()), torch.float32, (8,)) is None


_RECORD_CASES = {
    "fp32-2d": torch.randn(64, 32),
    "bf16": torch.randn(7).bfloat16(),
    "scalar": torch.tensor(3.0),
    "int8-16-bytes": torch.randn(4, 4).to(torch.int8),  # as long as a zip record name: found by address, not size
    "transposed": torch.randn(5, 4).t(),
    "bool": torch.rand(9) > 0.5,
    "large": torch.randn(300_000),  # > 1 MB: written in one piece, never copied into the template
}


@pytest.mark.parametrize("name", list(_RECORD_CASES))
def test_tensor_records_are_the_bytes_torch_save_writes(name: str) -> None:
    # Shard files hold each tensor as a torch.save zip. write_tensor_record writes it from a cached head and tail
    # around the raw data (no pickling): the bytes must be exactly torch.save's, for this tensor and for another
    # of the same layout that reuses the template, and plain torch.load(weights_only=True) must read them back.
    import io

    from disttrain.checkpoint.writer import _zip_crc32_off, write_tensor_record

    tensor = _RECORD_CASES[name]
    other = torch.empty_like(tensor).copy_(tensor.flip(0) if tensor.dim() else tensor + 1)
    with _zip_crc32_off():
        for t in (tensor, other):
            ours, theirs = io.BytesIO(), io.BytesIO()
            assert write_tensor_record(ours, t)
            torch.save(t, theirs)
            assert ours.getvalue() == theirs.getvalue()
            ours.seek(0)
            assert torch.equal(torch.load(ours, weights_only=True), t)


def test_tensor_records_leave_unusual_tensors_to_torch_save() -> None:
    import io

    from disttrain.checkpoint.writer import _zip_crc32_off, write_tensor_record

    unusual = [torch.zeros(0), torch.ones(3, requires_grad=True), torch.arange(10.0)[2:5], nn.Parameter(torch.ones(2))]
    with _zip_crc32_off():
        for t in unusual:
            buf = io.BytesIO()
            assert not write_tensor_record(buf, t)
            assert buf.tell() == 0
    buf = io.BytesIO()  # with the zip CRC on, records would carry a checksum of the data: torch.save's job
    assert not write_tensor_record(buf, torch.ones(3))


def test_shard_files_are_byte_identical_to_dcps_own_writer(tmp_path: Path) -> None:
    # The whole shard file, written through our writer (O_DIRECT where the file system has it, records without
    # pickling), equals what DCP's stock FileSystemWriter writes for the same state, and DCP's stock reader loads it.
    import torch.distributed.checkpoint as dcp

    from disttrain.checkpoint.writer import ChecksummingWriter, _zip_crc32_off

    state: dict[str, Any] = {f"t{i}": t for i, t in enumerate(_RECORD_CASES.values())}
    state |= {"empty": torch.zeros(0, 3), "slice": torch.arange(10.0)[2:5], "extra": {"epoch": 3, "names": ["a"]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no process group: assuming a single process"
        with _zip_crc32_off():
            dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "stock"), no_dist=True)
        dcp.save(state, storage_writer=ChecksummingWriter(tmp_path / "ours", 0, 1, {}), no_dist=True)
        shards = sorted(p.name for p in (tmp_path / "stock").glob("*.distcp"))
        assert shards and shards == sorted(p.name for p in (tmp_path / "ours").glob("*.distcp"))
        for shard in shards:
            assert (tmp_path / "ours" / shard).read_bytes() == (tmp_path / "stock" / shard).read_bytes()
        back: dict[str, Any] = {k: torch.zeros_like(v) for k, v in state.items() if isinstance(v, torch.Tensor)}
        back["extra"] = {"epoch": None, "names": None}  # DCP loads into the keys it is given
        dcp.load(back, storage_reader=dcp.FileSystemReader(tmp_path / "ours"), no_dist=True)
    assert all(torch.equal(back[k], v) for k, v in state.items() if isinstance(v, torch.Tensor))
    assert back["extra"] == state["extra"]


def test_direct_io_shard_files_hold_exactly_what_was_written(tmp_path: Path) -> None:
    # Shard files bypass the page cache (O_DIRECT, aligned buffers written by a helper thread while the next
    # fills): odd-sized writes across several buffers must land byte for byte, with the size and CRC32 recorded.
    import random
    import zlib

    from disttrain.checkpoint.writer import DIRECT_CHUNK, _ChecksummingFileSystem, _open_direct

    probe = _open_direct(tmp_path / "probe.distcp")
    if probe is None:
        pytest.skip("this file system takes no O_DIRECT (the buffered path is used there)")
    os.close(probe)
    rng = random.Random(0)
    data = rng.randbytes(2 * DIRECT_CHUNK + 3 * 4096 + 17)
    fs = _ChecksummingFileSystem(direct_io=True)
    path = tmp_path / "__0_0.distcp"
    with fs.create_stream(path, "wb") as f:
        pos = 0
        while pos < len(data):
            n = rng.choice([1, 7, 4096, 65_537, 3 << 20])
            f.write(data[pos : pos + n])
            pos = min(pos + n, len(data))
            assert f.tell() == pos
    assert path.read_bytes() == data
    assert fs.sums["__0_0.distcp"] == (len(data), zlib.crc32(data))
    with pytest.raises(RuntimeError, match="serializer failed"), fs.create_stream(tmp_path / "__1_0.distcp", "wb") as f:
        f.write(data[: DIRECT_CHUNK + 5])
        raise RuntimeError("serializer failed")
    assert "__1_0.distcp" not in fs.sums  # a failed file is never counted as written


def test_direct_io_falls_back_to_buffered_when_the_file_system_refuses_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some file systems open with O_DIRECT and then want another alignment (EINVAL): the file goes on buffered.
    import errno
    import fcntl
    import zlib

    import disttrain.checkpoint.writer as ck

    probe = ck._open_direct(tmp_path / "probe.distcp")
    if probe is None:
        pytest.skip("this file system takes no O_DIRECT")
    os.close(probe)
    real_pwrite, refused = os.pwrite, []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(ck.os, "pwrite", pwrite)
    data = os.urandom(ck.DIRECT_CHUNK + 1000)
    fs = ck._ChecksummingFileSystem(direct_io=True)
    with fs.create_stream(tmp_path / "__0_0.distcp", "wb") as f:
        f.write(data)
    assert refused == [0]  # refused once, then buffered
    assert (tmp_path / "__0_0.distcp").read_bytes() == data
    assert fs.sums["__0_0.distcp"] == (len(data), zlib.crc32(data))


def test_background_threads_get_the_configured_niceness_never_the_main_thread() -> None:
    import threading

    from disttrain.checkpoint.writer import _lower_this_thread

    seen: dict[str, int] = {}

    def worker() -> None:
        _lower_this_thread(7)
        seen["worker"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    _lower_this_thread(7)  # from the main thread (a sync save): ignored
    assert seen["worker"] == max(7, main_before)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before


def test_background_nice_out_of_range_is_a_config_error() -> None:
    from disttrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"checkpoint.background_nice must be a niceness from 0 to 19, got 25"):
        CheckpointConfig(background_nice=25)
