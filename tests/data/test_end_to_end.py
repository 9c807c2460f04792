"""End to end, as a user would (issue 29's acceptance): a few MB of generated multi-document ``.jsonl`` ->
``data prepare --tokenizer bpe:2048`` -> a Hugging Face Llama built from a config with the data's vocabulary ->
``disttrain run`` FSDP x 2 killed with ``kill -9`` mid-run and resumed bitwise -> ``ckpt export --format hf`` ->
``transformers`` loads the model and the tokenizer from the export and generates text.

Also: a Hugging Face config whose special ids disagree with the tokenizer is one line before any worker starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from text_corpus import make_docs, write_jsonl

from conftest import assert_one_line, disttrain, losses_by_step

STEPS, KILL_AT, EVERY = 10, 9, 3


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~3 MB of documents as .jsonl, tokenized by a 2,048-id BPE trained on them."""
    tmp = tmp_path_factory.mktemp("e2e")
    src = write_jsonl(tmp / "corpus.jsonl", make_docs(7_000, seed=7))
    assert src.stat().st_size > 2_000_000
    out = tmp / "prepared"
    proc = disttrain("data", "prepare", str(src), "--tokenizer", "bpe:2048", "--out", str(out), "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def job(folder: Path, root: Path, name: str, *extra: str) -> list[str]:
    """A tiny Llama (2 layers, width 64) on context 32, FSDP on 2 ranks in fp32, a checkpoint every 3 steps."""
    args = ["run", "--data.path", str(folder), "--model.module", "hf_models:llama_sized", "--model.context", "32"]
    args += ["--parallel.strategy", "fsdp", "--parallel.nproc", "2", "--precision.dtype", "fp32"]
    args += ["--train.steps", str(STEPS), "--train.global-batch", "16", "--train.micro-batch", "4"]
    args += ["--train.eval-interval", "0", "--train.eval-batches", "1", "--train.generate-chars", "40"]
    args += ["--metrics.log-interval", "1", "--checkpoint.interval", str(EVERY)]
    return [*args, "--run.root", str(root), "--run.name", name, *extra]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_jsonl_to_a_transformers_model_that_generates(prepared: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from disttrain.checkpoint.export import load_model_weights
    from disttrain.checkpoint.layout import find_checkpoint
    from disttrain.data.prepared import prepared_tokenizer

    ref = disttrain(*job(prepared, tmp_path, "ref"), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = losses_by_step(tmp_path / "ref")
    assert sorted(want) == list(range(1, STEPS + 1)) and want[STEPS] < want[1], want

    crash = disttrain(
        *job(prepared, tmp_path, "crash", "--launch.max-restarts", "1"),
        cwd=tmp_path,
        env={"DISTTRAIN_FAULT": f"step:{KILL_AT}:1"},  # SIGKILL rank 1 as it starts step 9 (first attempt only)
    )
    assert crash.returncode == 0, crash.stderr[-3000:]
    # from step 6, or 3 when the asynchronous save of step 6 was still in flight at the kill
    assert re.search(r"resumed from \S+step-0000000[36] \(step [36], sample (48|96)\)", crash.stdout), crash.stdout
    assert losses_by_step(tmp_path / "crash") == want  # bitwise: every logged loss

    run = tmp_path / "crash"
    tok = prepared_tokenizer(prepared)  # the tokenizer travels with the run, and the sample decodes through it
    source = json.loads((run / "tokenizer" / "source.json").read_text())
    assert source["sha256"] == tok.hash == json.loads((prepared / "index.json").read_text())["tokenizer"]["sha256"]
    assert "--- sample ---" in crash.stdout and (run / "sample.txt").read_text().strip()

    out = tmp_path / "export"
    export = disttrain("ckpt", "export", str(run), "--format", "hf", "--out", str(out), cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(out)
    hf_tok = AutoTokenizer.from_pretrained(out)
    saved = load_model_weights(find_checkpoint(run, None))  # the trained weights, as the checkpoint holds them
    for name, p in model.state_dict().items():
        assert torch.equal(p, saved[name]), name

    text = "doc 5: the quick brown fox jumps over a lazy dog; 日本 🙂"
    ids = hf_tok(text)["input_ids"]
    assert ids == tok.encode_batch([text])[0].tolist() and hf_tok.decode(ids) == text
    assert hf_tok.eos_token_id == model.config.eos_token_id == tok.eot_id and hf_tok.model_max_length == 32
    torch.manual_seed(0)
    prompt = hf_tok("doc 1:", return_tensors="pt")
    gen = model.generate(**prompt, max_new_tokens=12, do_sample=True, pad_token_id=hf_tok.eos_token_id)
    assert gen.shape[1] > prompt["input_ids"].shape[1]
    new = hf_tok.decode(gen[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert isinstance(new, str) and new.strip()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_hf_config_whose_special_ids_disagree_with_the_tokenizer_is_one_line(prepared: Path, tmp_path: Path) -> None:
    base = job(prepared, tmp_path, "x")
    wrong = [a if a != "hf_models:llama_sized" else "hf_models:llama_default_ids" for a in base]
    assert_one_line(
        disttrain(*wrong, "--print-config", cwd=tmp_path),
        "model.module 'hf_models:llama_default_ids': its config's eos_token_id 2 is not the tokenizer's end of text",
        "end of text 0 ('<|endoftext|>')",
        "build the config with eos_token_id=0, bos_token_id=0",
    )
