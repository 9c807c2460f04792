"""Training straight from raw files (``--data.path corpus.jsonl --data.tokenizer T``): the windows are a prepared
folder's, every global position names one window of the epoch whatever the number of ranks, a job resumes bitwise
after kill -9 and continues on 3 ranks, and bad input is one line before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from disttrain.data.loader import GlobalBatchLoader
from disttrain.data.permutation import TABLE_LIMIT, Feistel
from disttrain.data.prepared import load_prepared
from disttrain.data.stream import plan_raw, raw_windows
from disttrain.errors import ConfigError
from disttrain.jobs.data import PrepareConfig, prepare
from text_corpus import make_docs, write_jsonl

from conftest import assert_one_line, assert_resumes_exactly, bytes_job, disttrain, losses_by_step

pytestmark = pytest.mark.timeout(120)
BLOCK = 100_000
"""Bytes per block in the in-process tests: several blocks of a few units."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 5 .jsonl files (5 units), ~300 KB of documents."""
    folder = tmp_path_factory.mktemp("stream") / "corpus"
    folder.mkdir()
    docs = make_docs(1000, seed=2)
    for i in range(5):
        write_jsonl(folder / f"part-{i}.jsonl", docs[i * 200 : (i + 1) * 200])
    return folder


def key(w: tuple[torch.Tensor, torch.Tensor]) -> tuple[int, ...]:
    return (*w[0].tolist(), int(w[1][-1]))


@pytest.mark.timeout(60)
def test_raw_windows_are_the_prepared_windows(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    prepare(PrepareConfig((str(corpus),), "bytes", str(out), val_fraction=0.1))
    prepared = load_prepared(out, 32)
    train, val = raw_windows(str(corpus), "bytes", 32, seed=7, val_fraction=0.1, workers=1, block_bytes=BLOCK)
    n = len(prepared.train)
    epoch = [key(w) for w in train.at_positions(list(range(n)), 7)]
    assert len(train) == n and len(set(epoch)) == n  # every window once per epoch
    assert set(epoch) == {key(prepared.train[i]) for i in range(n)}
    assert epoch != [key(prepared.train[i]) for i in range(n)]  # shuffled (by blocks of units)
    assert len(train.blocks(7, 0)) > 1
    assert "the loader sets the pace" in train.pace_line(1e12) and "data prepare" in train.pace_line(1e12)
    second = [key(w) for w in train.at_positions(list(range(n, 2 * n)), 7)]
    assert set(second) == set(epoch) and second != epoch  # the next epoch: another order
    assert val is not None and prepared.val is not None
    assert {key(val[i]) for i in range(len(val))} <= {key(prepared.val[i]) for i in range(len(prepared.val))}


@pytest.mark.timeout(60)
def test_a_restart_at_another_world_size_continues_the_global_order(corpus: Path) -> None:
    """Steps 0-3 on 2 ranks, then a fresh loader (another process's, nothing kept) on 3 ranks from step 4: the
    union of the ranks' samples per step is the one-rank loader's, in the same positions."""

    def loaders(ranks: int, position: int) -> list[GlobalBatchLoader]:
        train = raw_windows(str(corpus), "bytes", 32, seed=3, val_fraction=0.1, workers=0, block_bytes=BLOCK)[0]
        out = [GlobalBatchLoader(train, 2, 6 // ranks, r, ranks, seed=3) for r in range(ranks)]
        for ld in out:
            ld.load_state_dict({"position": position, "seed": 3})
        return out

    def steps(lds: list[GlobalBatchLoader], n: int) -> list[set[tuple[int, ...]]]:
        got = []
        for _ in range(n):
            batches = [ld.next_step() for ld in lds]
            got.append({key((x[i], y[i])) for b in batches for x, y in b for i in range(len(x))})
        return got

    assert len(steps(loaders(1, 0), 1)[0]) == 12  # a global batch of 12: micro 2 x accum 6 / ranks x ranks
    start = 12 * 400  # deep into the epoch: several blocks in
    whole = raw_windows(str(corpus), "bytes", 32, seed=3, val_fraction=0.1, workers=0, block_bytes=BLOCK)[0]
    want = [{key(w) for w in whole.at_positions(list(range(s, s + 12)), 3)} for s in range(start, start + 48, 12)]
    assert steps(loaders(2, start), 4) == want
    assert steps(loaders(3, start), 4) == want


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill9_resumes_bitwise_and_3_ranks_continue(corpus: Path, tmp_path: Path) -> None:
    ref = disttrain(*bytes_job(corpus, tmp_path, "ref"), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert "data: tokenized on the fly at" in ref.stdout, ref.stdout
    want = losses_by_step(tmp_path / "ref")
    assert sorted(want) == list(range(1, 13)) and want[12] < want[1]

    assert_resumes_exactly(corpus, tmp_path, want)


@pytest.mark.timeout(60)
def test_bad_raw_input_is_one_line(corpus: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n{not json\n")
    assert_one_line(
        disttrain(*bytes_job(bad, tmp_path, "x", "--print-config"), cwd=tmp_path), f"{bad}:2: not a JSON line"
    )
    cases = [
        (str(tmp_path / "nope.jsonl"), "bytes", "data.path: input .* does not exist"),
        (str(corpus), "bpe:500", "'bpe:500' is made from a corpus: use it with `disttrain data prepare`"),
        (str(corpus), str(tmp_path / "tok.json"), "tok.json'?: no such file"),
    ]
    for path, tokenizer, message in cases:  # what the parent checks (the line above): in this process
        with pytest.raises(ConfigError, match=message):
            plan_raw(path, tokenizer)


@pytest.mark.timeout(90)
def test_one_document_trains_without_evaluation(tmp_path: Path) -> None:
    """A raw file of one document holds no held-out document: the job trains, evaluates nothing and says so."""
    one = tmp_path / "one.txt"
    one.write_text(" ".join(make_docs(60, seed=4)))
    run = disttrain(*bytes_job(one, tmp_path, "one", "--train.steps", "2", "--parallel.nproc", "1"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "done: 2 steps in" in run.stdout and "final val loss n/a (no evaluation ran)" in run.stdout, run.stdout
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["final_val_loss"] is None and summary["steps"] == 2


class _Many(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return TABLE_LIMIT * 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


@pytest.mark.timeout(30)
def test_a_big_dataset_is_shuffled_without_a_table() -> None:
    for n in (1, 2, 3, 5, 1000, 4099):
        perm = Feistel(n, 11)
        assert sorted(perm(i) for i in range(n)) == list(range(n))
    loader = GlobalBatchLoader(_Many(), 4, 1, 0, 2, seed=5)
    first = loader.next_step()[0].flatten().tolist()
    assert isinstance(loader._perm, Feistel) and len(set(first)) == 4
    again = GlobalBatchLoader(_Many(), 8, 1, 0, 1, seed=5).next_step()[0].flatten().tolist()
    assert first == again[:4]  # rank 0 of 2 holds the first micro-batch's positions of the one-rank order
