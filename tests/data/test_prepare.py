"""``disttrain data prepare|verify``: shards equal the tokenizer applied directly, byte-identical runs whatever
the number of workers, a killed prepare continues, every bad input is one line and exit 2 with nothing left
half-written, and verify names a corrupt shard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from text_corpus import make_docs, write_jsonl

from conftest import child_env, disttrain

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A folder of ~400 KB: two jsonl files (one gzipped), a parquet file and a text file; its documents in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("corpus") / "in"
    root.mkdir()
    docs = make_docs(2400)
    write_jsonl(root / "a.jsonl", docs[:1200])
    write_jsonl(root / "b.jsonl.gz", docs[1200:1800])
    pq.write_table(pa.table({"text": docs[1800:2399], "n": list(range(599))}), root / "c.parquet", row_group_size=100)
    (root / "d.txt").write_text(docs[2399] * 3)
    return root, [*docs[:2399], docs[2399] * 3]


def prepare(corpus: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["data", "prepare", str(corpus), "--out", str(out), "--shard-tokens", "20000", "--val-fraction", "0.1"]
    return disttrain(*args, *extra, cwd=out.parent)


@pytest.fixture(scope="module")
def prepared(corpus: tuple[Path, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prep") / "bpe"
    proc = prepare(corpus[0], out, "--tokenizer", "bpe:600", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert "MB/s" in proc.stderr and "prepared" in proc.stdout
    return out


def split_docs(folder: Path, split: str) -> list[np.ndarray]:
    index = json.loads((folder / "index.json").read_text())
    eot, dtype = index["tokenizer"]["eot_id"], np.dtype(index["dtype"]).newbyteorder("<")
    ids = np.concatenate([np.fromfile(folder / s["file"], dtype=dtype) for s in index["shards"] if s["split"] == split])
    assert ids[-1] == eot
    cuts = np.flatnonzero(ids == eot)
    return np.split(ids, cuts + 1)[:-1]


def test_shards_hold_each_document_as_the_tokenizer_encodes_it(prepared: Path, corpus: tuple[Path, list[str]]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(prepared / "tokenizer.json"))
    index = json.loads((prepared / "index.json").read_text())
    eot = index["tokenizer"]["eot_id"]
    assert index["dtype"] == "uint16" and index["vocab_size"] == tok.get_vocab_size() and index["units"] > 4
    got = {split: [tok.decode(d[:-1].tolist()) for d in split_docs(prepared, split)] for split in ("train", "val")}
    docs = corpus[1]
    assert sorted(got["train"] + got["val"]) == sorted(docs)  # every document once
    assert got["train"] == [d for d in docs if d in set(got["train"])]  # in input order
    assert 0.05 < len(got["val"]) / len(docs) < 0.15  # --val-fraction 0.1, chosen by document
    for split in ("train", "val"):
        for ids, text in list(zip(split_docs(prepared, split), got[split], strict=True))[::7]:
            assert ids[:-1].tolist() == tok.encode(text, add_special_tokens=False).ids and ids[-1] == eot
    for s in index["shards"]:
        assert s["documents"] == int((np.fromfile(prepared / s["file"], dtype="<u2") == eot).sum())


def test_a_second_run_is_byte_identical_whatever_the_workers(prepared: Path, corpus: tuple[Path, list[str]]) -> None:
    again = prepared.parent / "again"
    proc = prepare(corpus[0], again, "--tokenizer", "bpe:600", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in prepared.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    differ = [n for n in names if (prepared / n).read_bytes() != (again / n).read_bytes()]
    assert not differ


def test_a_killed_prepare_continues_where_it_stopped(prepared: Path, corpus: tuple[Path, list[str]]) -> None:
    """As after kill -9: no index, a unit's train shard missing, a stale temporary file; the re-run redoes that unit
    only and ends with the same files."""
    work = prepared.parent / "killed"
    subprocess.run(["cp", "-r", str(prepared), str(work)], check=True)
    (work / "index.json").unlink()
    (work / "train-00003.bin").unlink()
    (work / "val-00005.bin.tmp").write_bytes(b"half")
    proc = prepare(corpus[0], work, "--tokenizer", "bpe:600", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert "already done, continuing" in proc.stderr
    for p in prepared.iterdir():
        assert (work / p.name).read_bytes() == p.read_bytes(), p.name
    assert not list(work.glob("*.tmp"))


@pytest.mark.timing
def test_kill9_mid_prepare_then_rerun(tmp_path: Path) -> None:
    """A real SIGKILL while units are written; the re-run's files equal an uninterrupted run's."""
    src = write_jsonl(tmp_path / "big.jsonl", make_docs(12000, seed=1))
    args = ["--tokenizer", "chars", "--workers", "1", "--shard-tokens", "40000"]
    ref = prepare(src, tmp_path / "ref", *args)
    assert ref.returncode == 0, ref.stderr
    cmd = [sys.executable, "-c", "from disttrain.cli import main; main()", "data", "prepare", str(src)]
    cmd += ["--out", str(tmp_path / "k"), "--shard-tokens", "40000", "--val-fraction", "0.1", *args]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and len(list((tmp_path / "k").glob("train-*.bin"))) < 2 and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    again = prepare(src, tmp_path / "k", *args)
    assert again.returncode == 0, again.stderr
    for p in (tmp_path / "ref").iterdir():
        assert (tmp_path / "k" / p.name).read_bytes() == p.read_bytes(), p.name


def one_line_error(proc: subprocess.CompletedProcess[str], *parts: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("disttrain: error: "), proc.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


def test_every_bad_input_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = [json.dumps({"text": d}) for d in make_docs(20)]
    (tmp_path / "badline.jsonl").write_text("\n".join([*good[:2], "{not json", *good[2:]]) + "\n")
    (tmp_path / "nofield.jsonl").write_text("\n".join([*good, json.dumps({"body": "x"})]) + "\n")
    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "nocol.parquet")
    (tmp_path / "empty.jsonl").write_text(json.dumps({"text": "  "}) + "\n\n" + json.dumps({"text": ""}) + "\n")
    (tmp_path / "junk.json").write_text('{"hello": 1}')
    ok = str(tmp_path / "nocol.parquet")
    cases = [
        (["badline.jsonl", "--tokenizer", "bytes"], ["badline.jsonl:3", "not a JSON line"]),
        (["nofield.jsonl", "--tokenizer", "bytes"], ["nofield.jsonl:21", "'text'", "--text-field"]),
        (["nocol.parquet", "--tokenizer", "bytes"], ["no column 'text'", "body", "--text-field"]),
        (["empty.jsonl", "--tokenizer", "bytes"], ["no documents"]),
        ([ok, "--tokenizer", str(tmp_path / "nope.json")], ["nope.json", "no such file", "bpe:VOCAB"]),
        ([ok, "--tokenizer", "junk.json"], ["junk.json", "not a Hugging Face tokenizer file"]),
        ([ok, "--tokenizer", "bpe:ten"], ["bpe:ten", "whole number"]),
        (["missing.jsonl", "--tokenizer", "bytes"], ["missing.jsonl", "does not exist"]),
    ]
    for i, (argv, parts) in enumerate(cases):
        out = tmp_path / f"out{i}"
        one_line_error(disttrain("data", "prepare", *argv, "--out", str(out), "--workers", "1", cwd=tmp_path), *parts)
        assert not out.exists(), argv


def test_verify_names_a_corrupt_shard(prepared: Path, tmp_path: Path) -> None:
    ok = disttrain("data", "verify", str(prepared))
    assert ok.returncode == 0 and "every CRC32 matches" in ok.stdout, ok.stderr
    work = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(prepared), str(work)], check=True)
    with open(work / "val-00002.bin", "r+b") as f:
        f.seek(7)
        byte = f.read(1)
        f.seek(7)
        f.write(bytes([byte[0] ^ 0x10]))
    bad = disttrain("data", "verify", str(work))
    assert bad.returncode == 1 and "val-00002.bin: CRC32" in bad.stderr and "corrupt" in bad.stderr, bad.stderr
    assert "train-" not in bad.stderr
    one_line_error(disttrain("data", "verify", str(tmp_path)), "index.json", "data prepare")


def test_tokenizers_round_trip_and_hash_stably(tmp_path: Path) -> None:
    from disttrain.data.tokenizers import load_tokenizer, saved_tokenizer

    docs = make_docs(50)
    for spec in ("bytes", "chars", "bpe:400"):
        tok = load_tokenizer(spec, corpus=iter(docs))
        ids = tok.encode_batch(docs[:5])
        assert [tok.decode(i) for i in ids] == docs[:5], spec
        assert max(int(i.max()) for i in ids) < tok.vocab_size and tok.eot_id < tok.vocab_size
        assert [list(e.ids) for e in tok.hf.encode_batch(docs[:5], add_special_tokens=False)] == [
            i.tolist() for i in ids
        ], spec  # the fast paths give the saved JSON's ids
        tok.save(tmp_path)
        back = saved_tokenizer(tmp_path, spec, tok.eot_id)
        assert back.hash == tok.hash and back.encode_batch(docs[:1])[0].tolist() == ids[0].tolist()
    assert load_tokenizer("bytes").hash == load_tokenizer("bytes").hash and load_tokenizer("bytes").vocab_size == 257
    hf = tmp_path / "hf"  # a save_pretrained folder: the end of text from tokenizer_config.json
    hf.mkdir()
    (hf / "tokenizer.json").write_text((tmp_path / "tokenizer.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    assert load_tokenizer(str(hf)).eot_id == load_tokenizer("bpe:400", corpus=iter(docs)).eot_id
