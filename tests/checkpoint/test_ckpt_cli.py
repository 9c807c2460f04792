"""`disttrain ckpt ls|inspect|verify|export` on real checkpoints written by `disttrain run` (DDP and FSDP, 2 ranks):
what they show, what `verify` reports for each kind of damage, and exports loadable into the plain model."""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from disttrain.checkpoint.export import load_state
from disttrain.cli import main
from disttrain.errors import CheckpointError
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.testing.launch import together

from conftest import disttrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TINY = "--model.n-layers 2 --model.d-model 64 --model.n-heads 2 --model.context 32 --train.steps 8"
TINY += " --checkpoint.interval 4 --train.generate-chars 0 --train.eval-interval 0 --precision.dtype fp32"
STEP8 = "step-00000008"
GPT_CFG = GPTConfig(vocab_size=81, n_layers=2, d_model=64, n_heads=2, context=32)  # 81: the bundled corpus


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real 2-rank jobs, checkpointing at steps 4 and 8: one DDP (the default), one FSDP."""
    root = tmp_path_factory.mktemp("ckpt-runs")
    procs = together(
        *(
            functools.partial(disttrain, "run", *TINY.split(), "--run.root", str(root), "--run.name", name, *extra)
            for name, extra in (("ddp", []), ("fsdp", ["--parallel.strategy", "fsdp"]))
        )
    )
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"ddp": root / "ddp", "fsdp": root / "fsdp"}


def ckpt(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`disttrain ckpt ...` through the CLI's entry point, in this process (no import cost per call)."""
    rc = main(["ckpt", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def damaged_copy(runs: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of the DDP run's step-8 checkpoint, keeping its name, to break."""
    dst = tmp_path / "checkpoints" / STEP8
    shutil.copytree(runs["ddp"] / "checkpoints" / STEP8, dst)
    return dst


def verify_problems(capsys: pytest.CaptureFixture[str], step_dir: Path) -> list[dict[str, str]]:
    rc, out, _ = ckpt(capsys, "verify", str(step_dir))
    assert rc == 1, out
    lines = [ln for ln in out.splitlines() if ln.startswith(f"{STEP8}/")]
    rc, js, _ = ckpt(capsys, "verify", str(step_dir), "--json")
    problems = json.loads(js)["problems"]
    assert rc == 1 and len(lines) == len(problems) >= 1, out  # one line per problem
    for line, p in zip(lines, problems, strict=True):
        assert line == f"{STEP8}/{p['file']}: {p['problem']}"
    return problems


# -- ls / inspect -----------------------------------------------------------------------------------
def test_ls_shows_steps_sizes_status_world_size_and_strategy(runs: dict[str, Path], capsys: Any) -> None:
    for strategy, run in runs.items():
        rc, out, _ = ckpt(capsys, "ls", str(run))
        assert rc == 0
        rows = [[c.strip() for c in ln.strip("│ ").split("│")] for ln in out.splitlines() if "complete" in ln]
        assert [r[:2] for r in rows] == [["4", "complete"], ["8", "complete"]], out
        assert all(r[2].endswith(("KiB", "MiB")) and r[3:5] == ["2", strategy] for r in rows), out
        rc, js, _ = ckpt(capsys, "ls", str(run / "checkpoints"), "--json")
        data = json.loads(js)
        assert [r["step"] for r in data] == [4, 8]
        for r in data:
            folder = Path(r["path"])
            assert r["status"] == "complete" and r["world_size"] == 2 and r["strategy"] == strategy
            assert r["size_bytes"] == sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) > 100_000
    rc, js, _ = ckpt(capsys, "ls", str(runs["ddp"] / "checkpoints" / STEP8), "--json")
    assert [r["step"] for r in json.loads(js)] == [8]


def test_ls_marks_unfinished_and_broken_checkpoints(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    step8 = damaged_copy(runs, tmp_path)
    shutil.copytree(step8, step8.parent / ".tmp-step-00000012")
    (step8 / ".metadata").unlink()
    rc, js, _ = ckpt(capsys, "ls", str(tmp_path), "--json")
    assert rc == 0
    assert [(r["step"], r["status"]) for r in json.loads(js)] == [(8, "broken"), (12, "incomplete")]


def test_inspect_lists_keys_shapes_dtypes_and_per_rank_shards(runs: dict[str, Path], capsys: Any) -> None:
    rc, out, _ = ckpt(capsys, "inspect", str(runs["ddp"]))
    assert rc == 0
    assert "step 8" in out and "world size 2" in out and "strategy ddp" in out
    row = next(ln for ln in out.splitlines() if "app.model.tok_emb.weight " in ln)
    assert "81x64" in row and "float32" in row
    assert "__0_0.distcp" in out and "__1_0.distcp" in out and "app.optim.state." in out

    for strategy, run in runs.items():
        rc, js, _ = ckpt(capsys, "inspect", str(run), "--step", "4", "--json", "--prefix", "app.model.")
        d = json.loads(js)
        assert d["step"] == 4 and d["strategy"] == strategy and d["world_size"] == 2
        keys = {k["key"]: k for k in d["keys"]}
        assert len(keys) == len(GPT(GPT_CFG).state_dict()) and all(k.startswith("app.model.") for k in keys)
        emb = keys["app.model.tok_emb.weight"]
        assert emb["shape"] == [81, 64] and emb["dtype"] == "float32"
        sizes = {(c["rank"], tuple(c["sizes"])) for c in emb["chunks"]}
        whole = {(emb["chunks"][0]["rank"], (81, 64))}  # DDP: each tensor stored once, by one rank
        assert sizes == ({(0, (41, 64)), (1, (40, 64))} if strategy == "fsdp" else whole)
        ranks = {r["rank"]: r for r in d["ranks"]}
        assert set(ranks) == {0, 1}
        for r in ranks.values():
            assert r["size_bytes"] == (run / "checkpoints" / "step-00000004" / r["file"]).stat().st_size
            assert 0 < r["tensor_bytes"] < r["size_bytes"] and r["items"] > 0


# -- verify -----------------------------------------------------------------------------------------
def test_verify_passes_on_intact_checkpoints(runs: dict[str, Path], capsys: Any) -> None:
    for run in runs.values():
        rc, out, _ = ckpt(capsys, "verify", str(run), "--all")
        assert rc == 0 and out.count("OK: ") == 2, out
        rc, js, _ = ckpt(capsys, "verify", str(run / "checkpoints"), "--json")
        r = json.loads(js)
        assert rc == 0 and r["ok"] and r["problems"] == [] and r["step"] == 8
        assert r["items_read"] > 100 and r["files_matching_manifest"] == 5


def test_verify_reports_a_truncated_shard(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    step8 = damaged_copy(runs, tmp_path)
    os.truncate(step8 / "__1_0.distcp", 1000)
    problems = verify_problems(capsys, step8)
    assert {p["file"] for p in problems} == {"__1_0.distcp"}
    assert "truncated: 1000 bytes" in problems[0]["problem"]
    assert "stored items unreadable" in problems[1]["problem"]


def test_verify_reports_a_missing_metadata(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    step8 = damaged_copy(runs, tmp_path)
    (step8 / ".metadata").unlink()
    (problem,) = verify_problems(capsys, step8)
    assert problem["file"] == ".metadata" and problem["problem"].startswith("missing")


def test_verify_reports_a_marker_without_files(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    step8 = damaged_copy(runs, tmp_path)
    for f in [*step8.glob("*.distcp"), step8 / ".metadata"]:
        f.unlink()
    problems = verify_problems(capsys, step8)  # the manifest still names what is gone
    assert {p["file"]: p["problem"].split(" ")[0] for p in problems} == dict.fromkeys(
        ("__0_0.distcp", "__1_0.distcp", ".metadata"), "missing"
    )
    for f in step8.iterdir():  # nothing left but the marker
        shutil.rmtree(f) if f.is_dir() else f.unlink() if f.name != "COMMITTED" else None
    problems = verify_problems(capsys, step8)
    assert {p["file"] for p in problems} == {"manifest.json", ".metadata", "__<rank>_0.distcp"}
    assert all("missing" in p["problem"] or "no shard files" in p["problem"] for p in problems)


def test_verify_reports_a_flipped_byte(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    step8 = damaged_copy(runs, tmp_path)
    shard = step8 / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = verify_problems(capsys, step8)
    assert problems[0]["file"] == "__0_0.distcp" and "CRC32" in problems[0]["problem"]


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_metadata_pickle_is_refused_never_run(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    step8 = damaged_copy(runs, tmp_path)
    marker = tmp_path / "PWNED"
    (step8 / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    proc = disttrain("ckpt", "verify", str(step8))  # the real command, as a user would run it
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{STEP8}/.metadata: unreadable or untrusted (global 'posix.system' is not allowed" in proc.stdout
    for cmd in ("inspect", "export"):
        rc, _, err = ckpt(capsys, cmd, str(step8))
        assert rc == 2 and err.startswith("disttrain: error: ") and err.count("\n") == 1, err
    with pytest.raises(CheckpointError, match="not allowed"):
        load_state(step8)
    assert not marker.exists()


def test_errors_are_one_line_with_exit_code_2(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    proc = disttrain("ckpt", "ls", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stderr == f"disttrain: error: {tmp_path / 'nope'} does not exist\n"
    for args, needle in [
        (["ls", str(tmp_path)], "is not a checkpoint folder"),
        (["verify", str(runs["ddp"]), "--step", "99"], "no checkpoint of step 99"),
        (["export", str(runs["ddp"]), "--format", "safetensors", "--out", str(tmp_path / "w.pt")], "does not fit"),
    ]:
        rc, _, err = ckpt(capsys, *args)
        assert rc == 2 and err.startswith("disttrain: error: ") and needle in err and err.count("\n") == 1, err


# -- export -----------------------------------------------------------------------------------------
def dcp_model_weights(step_dir: Path) -> dict[str, torch.Tensor]:
    """The reference: DCP's own reader and empty planner, the model's keys only (no pickled objects read)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sd: dict[str, Any] = {}
    planner = _EmptyStateDictLoadPlanner(keys={"app.model"})
    _load_state_dict(sd, storage_reader=FileSystemReader(step_dir), planner=planner, no_dist=True)
    return sd["app"]["model"]


def plain_model(weights: dict[str, torch.Tensor]) -> GPT:
    model = GPT(GPT_CFG)
    model.load_state_dict(weights, strict=True)
    return model.eval()


BATCH = torch.randint(0, 81, (4, 32), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_export_loads_into_the_plain_model(
    runs: dict[str, Path], tmp_path: Path, capsys: Any, strategy: str, fmt: str, dtype: str
) -> None:
    assert not dist.is_initialized()  # no process group anywhere in this process
    run = runs[strategy]
    out = tmp_path / f"w.{'safetensors' if fmt == 'safetensors' else 'pt'}"
    rc, msg, _ = ckpt(capsys, "export", str(run), "--format", fmt, "--dtype", dtype, "--out", str(out))
    assert rc == 0 and f"wrote {out}" in msg
    if fmt == "torch":
        weights = torch.load(out, weights_only=True)
    else:
        from safetensors.torch import load_file

        weights = load_file(str(out))
    assert {t.dtype for t in weights.values()} == {torch.float32 if dtype == "fp32" else torch.bfloat16}
    reference = dcp_model_weights(run / "checkpoints" / STEP8)
    with torch.no_grad():
        got, want = plain_model(weights)(BATCH), plain_model(reference)(BATCH)
    if dtype == "fp32":
        assert all(torch.equal(weights[k], reference[k]) for k in reference)
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, atol=0.02, rtol=0.02)  # measured: 0.0035


def test_export_default_path_and_ddp_equals_fsdp(runs: dict[str, Path], capsys: Any) -> None:
    for run in runs.values():
        rc, _, _ = ckpt(capsys, "export", str(run / "checkpoints" / "step-00000004"), "--format", "torch")
        assert rc == 0 and (run / "model.pt").is_file()
    ddp, fsdp = (torch.load(runs[s] / "model.pt", weights_only=True) for s in ("ddp", "fsdp"))
    assert ddp.keys() == fsdp.keys()
    for k in ddp:  # the same training, sharded two ways
        torch.testing.assert_close(ddp[k], fsdp[k], atol=1e-4, rtol=1e-4)
