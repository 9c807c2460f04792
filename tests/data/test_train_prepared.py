"""Training from a prepared folder (``--data.path DIR``): the tiny GPT on 2 ranks resumes bitwise after kill -9,
continues the global sample position on 3 ranks, and a folder of another tokenizer or a vocabulary larger than
the model's embedding is one line before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from text_corpus import make_docs, write_jsonl

from conftest import assert_one_line, assert_resumes_exactly, bytes_job, disttrain, losses_by_step

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~300 KB corpus of documents prepared with the bytes tokenizer into several shards."""
    tmp = tmp_path_factory.mktemp("train-prepared")
    src = write_jsonl(tmp / "corpus.jsonl", make_docs(1000, seed=2))
    out = tmp / "prepared"
    proc = disttrain("data", "prepare", str(src), "--tokenizer", "bytes", "--out", str(out), "--shard-tokens", "40000")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
def test_kill9_resumes_bitwise_and_3_ranks_continue_the_position(folder: Path, tmp_path: Path) -> None:
    ref = disttrain(*bytes_job(folder, tmp_path, "ref"), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = losses_by_step(tmp_path / "ref")
    assert sorted(want) == list(range(1, 13)) and want[12] < want[1]
    summary = json.loads((tmp_path / "ref" / "summary.json").read_text())
    assert summary["final_val_loss"] is not None  # the index's val shards

    assert_resumes_exactly(folder, tmp_path, want)


@pytest.mark.slow
def test_another_tokenizer_or_a_small_embedding_is_one_line(folder: Path, tmp_path: Path) -> None:
    base = bytes_job(folder, tmp_path, "x")
    base = [a for a in base if a not in ("--data.tokenizer", "bytes")]
    assert_one_line(
        disttrain(*base, "--data.tokenizer", "bpe:500", "--print-config", cwd=tmp_path),
        "data.tokenizer 'bpe:500' is not the tokenizer",
        "'bytes'",
    )
    assert_one_line(
        disttrain(*base, "--model.module", "usermodel:build", "--print-config", cwd=tmp_path),
        "embeds 128 token ids, but the data has 257",
    )
