"""Small shared pieces of the config: the dtype names, the check helper, byte sizes, close-match hints."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, ClassVar

from disttrain.errors import ConfigError

if TYPE_CHECKING:
    import torch


class _Dtypes(Mapping[str, "torch.dtype"]):
    """The dtype names, resolved to torch dtypes on lookup: the config (and so ``disttrain CMD --help``) imports
    no torch; the names alone (``in``, iteration) need none."""

    _NAMES: ClassVar[dict[str, str]] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

    def __getitem__(self, name: str) -> torch.dtype:
        import torch

        return getattr(torch, self._NAMES[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._NAMES)

    def __len__(self) -> int:
        return len(self._NAMES)


DTYPES: Mapping[str, torch.dtype] = _Dtypes()
"""The dtype names the config accepts (compute, reduction, export)."""


def check(cond: bool, msg: str) -> None:
    """Raise :class:`ConfigError` with ``msg`` (the rule, the value and the fix) unless ``cond``."""
    if not cond:
        raise ConfigError(msg)


_UNITS = {
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_bytes(text: str, what: str = "memory size") -> int:
    """'80GiB', '512MB', '1.5T', '1000B' -> bytes; ConfigError saying the accepted forms otherwise. A number without
    a unit is an error: '80' could mean bytes or GiB, and a plan made with the wrong one is silently useless."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(
            f"{what}: cannot read {text!r} as a size; write a number and a unit, e.g. 80GiB, 24GB, 512MiB "
            "(units: B, kB/KiB, MB/MiB, GB/GiB, TB/TiB)"
        )
    return int(float(m.group(1)) * _UNITS[unit])


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending (for "try ..." hints)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def suggest(name: str, choices: list[str]) -> str:
    """'; did you mean X?' for the closest of ``choices``, else the list of them."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(choices))}"
