"""Models the project did not write (tests/hf_models.py): Hugging Face GPT-2 and Llama, returned directly and
wrapped, train to the same numbers under every strategy; meta-device initialisation is proven complete;
pretrained weights load into shards; tied weights stay tied; checkpoints export to a Hugging Face folder.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from disttrain.build import build_for_training, build_model, resolve_init
from disttrain.checkpoint.pretrained import load_pretrained
from disttrain.config import from_dict
from disttrain.data.loader import collate
from disttrain.data.text import load_text_data
from disttrain.errors import ConfigError, MetaDeviceError
from disttrain.models.outputs import logits_of, loss_of
from disttrain.parallel.meta_init import materialize
from disttrain.testing.launch import together
from disttrain.testing.tiny import tiny_cli_args, tiny_config
from disttrain.train.loss import Objective, cross_entropy

from conftest import disttrain, run_scenario

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (make test installs it)")
import hf_models  # noqa: E402  (needs transformers)

MODELS = ["gpt2", "gpt2_wrapped", "llama", "llama_wrapped"]


def hf_job(data: Path, module: str, **sections: dict[str, Any]) -> dict[str, Any]:
    cfg = tiny_config(data, **sections)
    cfg["model"]["module"] = f"hf_models:{module}"
    cfg["train"]["steps"] = 6
    return cfg


# -- one process, no group --------------------------------------------------------------------------------
def test_every_output_shape_gives_its_logits_and_a_clear_error_otherwise() -> None:
    logits = torch.randn(2, 3, 5)
    out = hf_models.gpt2()(torch.randint(0, 128, (2, 3)), labels=torch.randint(0, 128, (2, 3)))
    assert logits_of(out) is out.logits and loss_of(out) is out.loss  # a ModelOutput
    for wrapped in (logits, {"logits": logits}, (logits, None), [logits]):
        assert logits_of(wrapped) is logits
    targets = torch.randint(0, 5, (2, 3))
    assert torch.equal(cross_entropy({"logits": logits}, targets), cross_entropy(logits, targets))
    with pytest.raises(TypeError, match="holds no logits"):
        logits_of({"hidden": logits})
    with pytest.raises(TypeError, match="without a 'loss' tensor"):
        loss_of(logits)


def test_the_models_own_loss_gets_labels_it_expects() -> None:
    cfg = from_dict({"model": {"loss": "model"}}).model
    assert Objective.from_config(cfg, hf_models.gpt2()).labels == "inputs"  # HF causal LMs shift them
    assert Objective.from_config(cfg, hf_models.gpt2_wrapped()).labels == "targets"
    x, y = torch.zeros(1, 2), torch.ones(1, 2)
    assert Objective(labels="inputs").call_kwargs(x, y)["labels"] is x
    assert Objective().call_kwargs(x, y) == {}
    assert Objective.from_config(from_dict({}).model, hf_models.gpt2()).loss_fn is cross_entropy


def test_init_auto_is_meta_only_where_exact_or_replaced(small_text: Path) -> None:
    def meta(module: str | None) -> torch.nn.Module:
        cfg = from_dict(hf_job(small_text, module or "gpt2"))
        if module is None:
            cfg.model.module = None
        return build_model(cfg, 65, on_meta=True)

    assert resolve_init("auto", meta(None)) == "meta"  # the built-in GPT: init_param, exact at any world size
    assert resolve_init("auto", meta("gpt2")) == "cpu"  # the same weights as one process
    assert resolve_init("auto", meta("gpt2"), weights=True) == "meta"  # pretrained weights replace them
    assert resolve_init("auto", meta("partial"), weights=True) == "cpu"  # no declared init: NaN check would fail
    assert resolve_init("cpu", meta(None)) == "cpu"


@pytest.mark.parametrize("module", ["gpt2", "llama_wrapped"])
def test_meta_init_of_hugging_face_models_is_complete_and_keeps_ties(small_text: Path, module: str) -> None:
    cfg = from_dict(hf_job(small_text, module, parallel={"init": "meta"}))
    model = build_for_training(cfg, 65, sharded=True)
    assert any(p.is_meta for p in model.parameters())
    materialize(model, torch.device("cpu"))  # raises if any tensor still holds NaN
    cpu = build_model(cfg, 65, on_meta=False)
    for (name, p), (_, q) in zip(model.named_parameters(), cpu.named_parameters(), strict=True):
        assert p.std().item() == pytest.approx(q.std().item(), rel=0.5, abs=1e-6), name  # HF's init, not garbage
    for (name, b), (_, c) in zip(model.named_buffers(), cpu.named_buffers(), strict=True):
        assert torch.equal(b, c), name  # rotary tables recomputed
    params = dict(model.named_parameters(remove_duplicate=False))
    head = next(p for n, p in params.items() if n.endswith("lm_head.weight"))
    emb = next(p for n, p in params.items() if n.endswith(("wte.weight", "embed_tokens.weight")))
    assert head is emb


def test_meta_init_that_misses_a_tensor_stops_with_its_name(small_text: Path) -> None:
    cfg = from_dict(hf_job(small_text, "partial", parallel={"init": "meta"}))
    model = build_for_training(cfg, 65, sharded=True)
    with pytest.raises(MetaDeviceError, match=r"2 tensor\(s\) were never initialised \(blocks.0.gain, blocks.1.gain\)"):
        materialize(model, torch.device("cpu"))
    cfg.parallel.init = "auto"
    assert not any(p.is_meta for p in build_for_training(cfg, 65, sharded=True).parameters())  # auto -> cpu


def test_a_buffer_computed_in_init_survives_the_meta_build(small_text: Path) -> None:
    cfg = from_dict(hf_job(small_text, "with_table", parallel={"init": "meta"}))
    meta = build_for_training(cfg, 65, sharded=True)
    materialize(meta, torch.device("cpu"))
    cpu = build_model(cfg, 65, on_meta=False)
    meta.load_state_dict(cpu.state_dict())  # the table is not in the state dict: it must already be right
    x = torch.randint(0, 128, (2, 16))
    assert torch.equal(meta(x), cpu(x))


def test_weights_names_are_matched_through_a_wrapper_and_mismatches_listed(tmp_path: Path) -> None:
    src = hf_models.gpt2()
    torch.manual_seed(99)
    src.lm_head.weight.data.normal_()  # tied: the embedding changes with it
    src.save_pretrained(tmp_path / "w")
    x = torch.randint(0, 128, (2, 16))
    for model in (hf_models.gpt2(), hf_models.gpt2_wrapped()):
        assert load_pretrained(model, tmp_path / "w") == 28
        assert torch.equal(logits_of(model(x)), src(x).logits)
    with pytest.raises(ConfigError, match=r"missing \(model.embed_tokens.weight.*unexpected \(transformer.h.0"):
        load_pretrained(hf_models.llama(), tmp_path / "w")
    with pytest.raises(ConfigError, match=r"no \.safetensors files in that folder"):
        load_pretrained(hf_models.gpt2(), tmp_path)


def test_a_tied_model_writes_as_one_plain_file(tmp_path: Path) -> None:
    """``checkpoint.save_final = model_only`` writes the live state dict, where the head and the embedding
    are one storage: safetensors refuses shared memory, so the copy is made apart."""
    from safetensors.torch import load_file

    from disttrain.checkpoint.export import write_weights

    model = hf_models.gpt2()
    write_weights(model.state_dict(), tmp_path / "m.safetensors")
    back = load_file(tmp_path / "m.safetensors")
    assert torch.equal(back["lm_head.weight"], back["transformer.wte.weight"])
    assert hf_models.gpt2().load_state_dict(back, strict=True) is not None


# -- several processes --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    torch.manual_seed(123)
    transformers.GPT2LMHeadModel(hf_models.gpt2_config()).save_pretrained(folder)
    return folder


def variants(data: Path, strategy: str, weights: Path) -> list[dict[str, Any]]:
    par = {"strategy": strategy}
    out = [{"name": m, "config": hf_job(data, m, parallel=par)} for m in MODELS]
    out += [
        {"name": "own_loss", "config": hf_job(data, "gpt2", parallel=par, model={"loss": "model"})},
        {
            "name": "weights",
            "inspect": "before_fit",
            "config": hf_job(data, "gpt2", parallel=par, model={"weights": str(weights)}, train={"steps": 1}),
        },
        {"name": "partial", "config": hf_job(data, "partial", parallel=par)},
    ]
    if strategy == "fsdp":
        out += [
            {"name": "accum", "config": hf_job(data, "gpt2", parallel=par, train={"micro_batch": 2})},
            {"name": "tied", "inspect": "after_fit", "config": hf_job(data, "llama", parallel=par)},
            {"name": "hsdp", "config": hf_job(data, "gpt2", parallel={"strategy": "hsdp", "replicate": 2, "shard": 1})},
        ]
    if strategy == "single":  # FSDP on one process (a 1-rank mesh), with and without offload
        one = {"strategy": "fsdp"}
        out += [
            {"name": "fsdp1", "config": hf_job(data, "gpt2", parallel=one)},
            {"name": "fsdp1_offload", "config": hf_job(data, "gpt2", parallel={**one, "offload": True})},
        ]
    return out


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory, small_text: Path, weights_dir: Path
) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("models")
    runs = [("single", 1, "single"), ("ddp2", 2, "ddp"), ("fsdp2", 2, "fsdp")]
    done = together(
        *(
            functools.partial(run_scenario, tmp, name, n, variants(small_text, strategy, weights_dir), timeout=400)
            for name, n, strategy in runs
        )
    )
    return {name: result for (name, _, _), result in zip(runs, done, strict=True)}


def losses(r: dict[str, Any], name: str) -> torch.Tensor:
    return torch.tensor(r[name]["losses"], dtype=torch.float64)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", [*MODELS, "own_loss", "partial"])
def test_every_strategy_gives_a_user_model_the_single_process_numbers(
    results: dict[str, list[dict[str, Any]]], name: str
) -> None:
    ref = losses(results["single"][0], name)
    assert len(ref) == 6 and bool(torch.isfinite(ref).all()) and ref[-1] < ref[0]
    for run in ("ddp2", "fsdp2"):
        for rank in results[run]:
            assert_close(losses(rank, name), ref, rtol=2e-5, atol=2e-5, msg=f"{name} under {run}")
    if name == "gpt2":
        for rank in results["fsdp2"]:
            assert_close(losses(rank, "accum"), ref, rtol=2e-5, atol=2e-5)  # 4 micro-steps of 2
            assert_close(losses(rank, "hsdp"), ref, rtol=2e-5, atol=2e-5)  # 2 replicas x 1 shard
        for one in ("fsdp1", "fsdp1_offload"):
            assert_close(losses(results["single"][0], one), ref, rtol=2e-5, atol=2e-5, msg=one)
    if name == "own_loss":  # Hugging Face's loss over T-1 shifted labels: close to ours, not equal
        assert abs(float(ref[0]) - float(losses(results["single"][0], "gpt2")[0])) < 0.1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pretrained_weights_load_into_shards_and_ties_hold(
    results: dict[str, list[dict[str, Any]]], small_text: Path, weights_dir: Path
) -> None:
    text = load_text_data(str(small_text), 32, 0.1)
    x, _ = collate([text.val[i * 97] for i in range(8)])
    with torch.no_grad():
        own = transformers.GPT2LMHeadModel.from_pretrained(weights_dir)(x).logits.float()
    expected = own.double().sum().item()
    for run in ("single", "ddp2", "fsdp2"):
        for rank in results[run]:
            got = rank["weights"]["inspect"]
            assert got["logits_sum"] == pytest.approx(expected, rel=1e-5, abs=1e-3), run
            assert_close(torch.tensor(got["logits_head"]), own[:2, :3, :4], rtol=1e-5, atol=1e-5)
    for rank in results["fsdp2"]:  # after 6 FSDP steps the embedding and the head are one tensor
        assert rank["tied"]["inspect"]["tied"] is True


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_exports_to_a_folder_from_pretrained_loads(tmp_path: Path, small_text: Path, weights_dir: Path) -> None:
    run = [
        "--model.module",
        "hf_models:gpt2",
        "--model.weights",
        str(weights_dir),
        "--parallel.strategy",
        "fsdp",
        "--run.root",
        str(tmp_path),
        "--run.name",
        "hf",
        "--checkpoint.interval",
        "3",
    ]
    proc = disttrain(*tiny_cli_args(small_text, 3, *run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "export"
    proc = disttrain(
        "ckpt", "export", str(tmp_path / "hf"), "--format", "hf", "--config-from", str(weights_dir), "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, info = transformers.GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.lm_head.weight is model.transformer.wte.weight
    from disttrain.checkpoint.export import load_model_weights
    from disttrain.checkpoint.layout import find_checkpoint

    saved = load_model_weights(find_checkpoint(tmp_path / "hf", None))
    for name, p in model.state_dict().items():
        assert torch.equal(p, saved[name]), name
    # without --config-from, the config comes from the pretrained folder the run started from
    again = disttrain("ckpt", "export", str(tmp_path / "hf"), "--format", "hf", "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "again").config.n_embd == model.config.n_embd
    start = transformers.GPT2LMHeadModel.from_pretrained(weights_dir).transformer.h[0].mlp.c_fc.weight
    assert not torch.equal(saved["transformer.h.0.mlp.c_fc.weight"], start)  # trained from the weights
    assert json.loads((out / "config.json").read_text())["n_embd"] == 64


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bad_weights_and_incomplete_meta_init_stop_with_one_line(tmp_path: Path, small_text: Path) -> None:
    base = ["--run.root", str(tmp_path), "--parallel.strategy", "fsdp"]
    proc = disttrain(
        *tiny_cli_args(
            small_text, 2, *base, "--model.module", "hf_models:gpt2", "--model.weights", str(tmp_path / "nope")
        )
    )
    assert proc.returncode == 2 and "model.weights" in proc.stderr and "does not exist" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = disttrain(
        *tiny_cli_args(small_text, 2, *base, "--model.module", "hf_models:partial", "--parallel.init", "meta")
    )
    assert proc.returncode != 0 and "never initialised (blocks.0.gain, blocks.1.gain)" in proc.stderr, proc.stderr
    assert "--parallel.init cpu" in proc.stderr and "Traceback" not in proc.stderr
