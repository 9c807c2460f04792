"""The tokenizer a run trained with, as the files a Hugging Face folder holds: ``tokenizer.json``,
``tokenizer_config.json`` (end of text, start of sequence, ``model_max_length``) and ``special_tokens_map.json``.

``disttrain run`` writes them into ``RUN/tokenizer/`` (as torchtitan and Hugging Face's Trainer keep the
tokenizer beside the checkpoints: the run stays readable when the prepared folder moves), the sample at the end of
a run decodes through them, and ``disttrain ckpt export --format hf`` copies them beside the weights, so that
``AutoTokenizer.from_pretrained`` loads the export (as a ``PreTrainedTokenizerFast``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from disttrain.data.tokenizers import TextTokenizer, file_tokenizer

RUN_TOKENIZER = "tokenizer"
"""The tokenizer's folder inside a run folder."""
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""What ``from_pretrained`` reads; ``source.json`` (where the tokenizer came from) stays in the run."""


def special_tokens(tok: TextTokenizer) -> dict[str, str]:
    """``{"eos_token": ..., "bos_token": ...}``: the names Hugging Face gives the tokenizer's special ids."""
    out = {"eos_token": tok.token(tok.eot_id)}
    if tok.bos_id is not None:
        out["bos_token"] = tok.token(tok.bos_id)
    return out


def write_tokenizer_folder(tok: TextTokenizer, folder: Path, model_max_length: int, source: dict[str, Any]) -> Path:
    """``folder`` with the tokenizer's Hugging Face files and ``source.json`` (its spec, sha256 and where it came
    from); each file written to a temporary name and renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(folder)
    special = special_tokens(tok)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    files = {
        "tokenizer_config.json": config,
        "special_tokens_map.json": special,
        "source.json": {"spec": tok.spec, "sha256": tok.hash, "eot_id": tok.eot_id, **source},
    }
    for name, value in files.items():
        tmp = folder / f"{name}.tmp"
        tmp.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(folder / name)
    return folder


def read_tokenizer_folder(folder: Path) -> TextTokenizer | None:
    """The tokenizer a run folder's ``tokenizer/`` holds, or None when the run trained without one."""
    if not (folder / "tokenizer.json").is_file():
        return None
    return file_tokenizer(str(folder), "the run's tokenizer")
