"""The run's tokenizer as Hugging Face files (what ``RUN/tokenizer/`` and an hf export hold) and the rules a
Hugging Face model's special ids follow against the data's tokenizer; in one process, no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hf_models
from disttrain.build import check_special_ids, special_id_problem
from disttrain.data.tokenizer_folder import read_tokenizer_folder, special_tokens, write_tokenizer_folder
from disttrain.data.tokenizers import bpe_tokenizer, bytes_tokenizer, file_tokenizer
from disttrain.errors import VocabularyError
from text_corpus import make_docs


def test_the_folder_loads_in_transformers_and_reads_back(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = bpe_tokenizer(400, make_docs(300, seed=1))
    folder = write_tokenizer_folder(tok, tmp_path / "tokenizer", 32, {"data_path": "/somewhere"})
    assert json.loads((folder / "source.json").read_text())["sha256"] == tok.hash
    hf = AutoTokenizer.from_pretrained(folder)
    text = "doc 3: the lazy fox — élan 🙂"
    ids = hf(text)["input_ids"]
    assert ids == tok.encode_batch([text])[0].tolist() and hf.decode(ids) == text
    assert (hf.eos_token_id, hf.bos_token_id, hf.model_max_length) == (tok.eot_id, tok.eot_id, 32)
    back = read_tokenizer_folder(folder)
    assert back is not None and (back.hash, back.eot_id, back.bos_id) == (tok.hash, tok.eot_id, tok.bos_id)
    assert read_tokenizer_folder(tmp_path / "none") is None


def test_a_tokenizer_file_keeps_its_own_start_of_sequence(tmp_path: Path) -> None:
    hf = bytes_tokenizer().hf
    hf.add_special_tokens(["<s>"])  # id 257: a start of sequence by name
    (tmp_path / "tokenizer.json").write_text(hf.to_str())
    assert file_tokenizer(str(tmp_path), "t").bos_id == 257
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>"}))
    assert file_tokenizer(str(tmp_path), "t").bos_id == 256  # the folder's tokenizer_config.json says
    assert special_tokens(bytes_tokenizer()) == {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}


@pytest.mark.parametrize(
    ("ids", "problem"),
    [
        ({}, None),  # bos = eos = 0, pad None: a bpe tokenizer's end of text
        ({"pad_token_id": 0}, None),
        ({"eos_token_id": [5, 0]}, None),  # one of them ends a document
        ({"eos_token_id": 2}, "eos_token_id 2 is not the tokenizer's end of text"),
        ({"bos_token_id": 1}, "bos_token_id 1 is not the tokenizer's start of sequence"),
        ({"pad_token_id": 5000}, "pad_token_id 5000 is not an id of the tokenizer (it has 400)"),
        ({"eos_token_id": [0, 400]}, "eos_token_id 400 is not an id of the tokenizer (it has 400)"),
    ],
)
def test_special_ids_must_be_the_tokenizers(ids: dict[str, object], problem: str | None) -> None:
    tok = bpe_tokenizer(400, make_docs(300, seed=1))
    config = hf_models.llama_config(8192, **ids)  # type: ignore[arg-type]
    assert special_id_problem(config, tok) == problem


def test_the_error_names_the_ids_and_the_fix() -> None:
    tok = bytes_tokenizer()
    with pytest.raises(VocabularyError) as e:
        check_special_ids(hf_models.llama_default_ids(300), tok, "m:build")
    assert str(e.value) == (
        "model.module 'm:build': its config's eos_token_id 2 is not the tokenizer's end of text (the 'bytes' "
        "tokenizer: end of text 256 ('<|endoftext|>'), start of sequence 256); build the config with "
        "eos_token_id=256, bos_token_id=256"
    )
