"""Tokenizers for real corpora: what ``--tokenizer`` / ``--data.tokenizer`` name, as one small interface.

Every kind is a Hugging Face ``tokenizers.Tokenizer`` underneath (so it saves as one ``tokenizer.json`` that
``PreTrainedTokenizerFast`` loads, and hashes as the sha256 of that JSON), with an end-of-text id that separates
documents:

- a ``tokenizer.json`` file, or a folder saved by ``save_pretrained`` (its ``tokenizer.json``; the end-of-text
  token from ``tokenizer_config.json``'s ``eos_token`` when it names one);
- ``bytes``: the 256 byte values, then ``<|endoftext|>`` (257 ids; nothing to train);
- ``bpe:VOCAB``: a byte-level BPE of VOCAB ids trained on the corpus itself;
- ``chars``: one id per distinct character of the corpus, then ``<|endoftext|>``.

``bytes`` and ``chars`` encode with numpy (the same ids their JSON gives, many times faster). Nothing is
downloaded. Mistakes are :class:`ConfigError` lines naming what, the value and the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from disttrain.errors import ConfigError

EOT = "<|endoftext|>"
EOT_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")
"""Special tokens taken for the end of a document, in this order, when a tokenizer file does not say."""
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[BOS]")
"""Special tokens taken for the start of a sequence of a tokenizer file that does not say (none: no bos)."""
BUILT = ("bytes", "chars")
"""Kinds made here (with ``bpe:VOCAB``): their start of sequence is the end-of-text token, as GPT-2's."""
KINDS = "a tokenizer.json file, a folder saved by save_pretrained, bytes, chars or bpe:VOCAB (e.g. bpe:8192)"
BPE_TRAIN_BYTES = 256 * 2**20
"""``bpe:VOCAB`` trains on the corpus's first documents up to this much text (enough for its statistics)."""


class TextTokenizer:
    """A tokenizer as prepared data uses it: batches of documents to ids, ids to text, its vocabulary size, its
    end-of-text id and a stable hash."""

    def __init__(self, spec: str, hf: Any, eot_id: int, bos_id: int | None = None) -> None:
        self.spec = spec
        """What was asked for: 'bytes', 'chars', 'bpe:8192' or a path."""
        self.hf = hf
        self.eot_id = eot_id
        self.bos_id = bos_id if bos_id is not None else default_bos(spec, hf, eot_id)
        """The start-of-sequence id a model's ``bos_token_id`` must be (None: the tokenizer has none)."""
        ids = hf.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(ids) + 1
        self.json = hf.to_str()
        self.hash = hashlib.sha256(self.json.encode()).hexdigest()
        self._codepoints: np.ndarray | None = None
        if spec == "chars":
            vocab = json.loads(self.json)["model"]["vocab"]
            chars = sorted(vocab, key=vocab.__getitem__)
            self._codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids (int64), without end-of-text ids."""
        if self.spec == "bytes":
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]
        if self._codepoints is not None:
            return [self._chars(t) for t in texts]
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)  # fast: no offsets
        return [np.array(e.ids, dtype=np.int64) for e in encode(list(texts), add_special_tokens=False)]

    def _chars(self, text: str) -> np.ndarray:
        assert self._codepoints is not None
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.minimum(np.searchsorted(self._codepoints, points), len(self._codepoints) - 1)
        unknown = self._codepoints[ids] != points
        if unknown.any():
            bad = chr(int(points[unknown][0]))
            raise ConfigError(f"tokenizer chars has no id for {bad!r}; prepare the corpus again with every character")
        return ids.astype(np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self.hf.decode([int(i) for i in ids], skip_special_tokens=False))

    def token(self, i: int) -> str:
        """The token of id ``i`` (e.g. ``'<|endoftext|>'``)."""
        return str(self.hf.id_to_token(i))

    def save(self, folder: Path) -> Path:
        """``folder/tokenizer.json`` (written to a temporary name, then renamed)."""
        path = folder / "tokenizer.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.json)
        tmp.replace(path)
        return path


def load_tokenizer(spec: str, what: str = "--tokenizer", corpus: Iterable[str] | None = None) -> TextTokenizer:
    """The tokenizer ``spec`` names; ``chars`` and ``bpe:VOCAB`` are made from ``corpus`` (documents)."""
    if spec == "bytes":
        return bytes_tokenizer()
    if spec == "chars" or spec.startswith("bpe:"):
        if corpus is None:
            raise ConfigError(f"{what} {spec!r} is made from a corpus: use it with `disttrain data prepare`")
        return chars_tokenizer(corpus) if spec == "chars" else bpe_tokenizer(bpe_vocab(spec, what), corpus)
    return file_tokenizer(spec, what)


def bpe_vocab(spec: str, what: str) -> int:
    text = spec.removeprefix("bpe:")
    if not text.isdigit() or not 257 < int(text) < 2**31:
        raise ConfigError(f"{what} {spec!r}: VOCAB must be a whole number above 257 (the 256 bytes + end of text)")
    return int(text)


def bytes_tokenizer() -> TextTokenizer:
    """256 ids, one per byte value (a byte-level BPE without merges), then ``<|endoftext|>`` (id 256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_alphabet()
    hf = Tokenizer(models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOT])
    return TextTokenizer("bytes", hf, 256)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte value (what ByteLevel pre-tokenizers produce)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    extra = (b for b in range(256) if b not in out)
    out.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return out


def chars_tokenizer(corpus: Iterable[str]) -> TextTokenizer:
    """One id per distinct character (sorted by code point, as the bundled demo's), then ``<|endoftext|>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    seen: set[str] = set()
    for doc in corpus:
        seen.update(doc)
    vocab = {c: i for i, c in enumerate(sorted(seen))}
    hf = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf.decoder = decoders.Fuse()
    hf.add_special_tokens([EOT])
    return TextTokenizer("chars", hf, len(vocab))


def bpe_tokenizer(vocab: int, corpus: Iterable[str]) -> TextTokenizer:
    """A byte-level BPE (GPT-2's pre-tokenization) of ``vocab`` ids trained on ``corpus``'s first documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(_first_bytes(corpus, BPE_TRAIN_BYTES), trainer=trainer)
    eot = hf.token_to_id(EOT)
    assert eot is not None  # a special token of the trainer
    return TextTokenizer(f"bpe:{vocab}", hf, eot)


def _first_bytes(corpus: Iterable[str], limit: int) -> Iterator[str]:
    total = 0
    for doc in corpus:
        yield doc
        total += len(doc)
        if total >= limit:
            return


def file_tokenizer(spec: str, what: str) -> TextTokenizer:
    """A ``tokenizer.json`` file or a ``save_pretrained`` folder holding one."""
    from tokenizers import Tokenizer

    path = Path(spec).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        where = f"the folder {str(path)!r} has no tokenizer.json" if path.is_dir() else "no such file"
        raise ConfigError(f"{what} {spec!r}: {where}; give {KINDS}")
    try:
        hf = Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust side raises plain Exceptions for any parse error
        first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise ConfigError(
            f"{what} {spec!r}: {file} is not a Hugging Face tokenizer file ({first}); give {KINDS}"
        ) from None
    return TextTokenizer(spec, hf, end_of_text(hf, file, what), start_of_sequence(hf, file))


def default_bos(spec: str, hf: Any, eot_id: int) -> int | None:
    """The start of sequence of a tokenizer: the end of text for the kinds made here, else a known name."""
    if spec in BUILT or spec.startswith("bpe:"):
        return eot_id
    found = (hf.token_to_id(name) for name in BOS_NAMES)
    return next((int(i) for i in found if i is not None), None)


def config_token(file: Path, key: str) -> str | None:
    """``tokenizer_config.json``'s ``key`` (``eos_token``, ``bos_token``) beside ``file``, when it names one."""
    config = file.with_name("tokenizer_config.json")
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def start_of_sequence(hf: Any, file: Path) -> int | None:
    """``tokenizer_config.json``'s bos_token beside the file, when it names a token of the tokenizer."""
    name = config_token(file, "bos_token")
    found = hf.token_to_id(name) if name is not None else None
    return int(found) if found is not None else None


def end_of_text(hf: Any, file: Path, what: str) -> int:
    """The id that ends a document: ``tokenizer_config.json``'s eos_token beside the file, else a known name."""
    names = list(EOT_NAMES)
    eos = config_token(file, "eos_token")
    if eos is not None:
        names.insert(0, eos)
    for name in names:
        found = hf.token_to_id(name)
        if found is not None:
            return int(found)
    raise ConfigError(
        f"{what} {str(file)!r} has no end-of-text token (looked for {', '.join(EOT_NAMES)} and tokenizer_config.json's "
        f"eos_token); add one to the tokenizer (tokenizer.add_special_tokens(['{EOT}'])) or use bpe:VOCAB"
    )


def saved_tokenizer(folder: Path, spec: str, eot_id: int) -> TextTokenizer:
    """The tokenizer a prepared folder holds (``folder/tokenizer.json``), as it was prepared with ``spec``."""
    from tokenizers import Tokenizer

    file = folder / "tokenizer.json"
    try:
        hf = Tokenizer.from_file(str(file))
    except Exception as e:
        raise ConfigError(f"{folder}: its tokenizer.json cannot be read ({e}); prepare the folder again") from None
    return TextTokenizer(spec, hf, eot_id)
