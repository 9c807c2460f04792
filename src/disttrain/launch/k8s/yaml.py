"""YAML for manifests, without a YAML library (disttrain does not depend on one): mappings, lists, numbers,
booleans and strings; a string that could read as anything else is written JSON-quoted (JSON strings are
YAML), a multi-line one as a literal block."""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:@=-]*")
_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return json.dumps(v)
    if v is None:
        return "null"
    s = str(v)
    if _PLAIN.fullmatch(s) and s.lower() not in _WORDS and not s.endswith(":"):
        return s
    return json.dumps(s)


def _lines(v: Any, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(v, dict):
        for k, x in v.items():
            key = _scalar(k)
            if isinstance(x, dict | list) and x:
                out.append(f"{pad}{key}:")
                out += _lines(x, indent + (2 if isinstance(x, dict) else 0))
            elif isinstance(x, str) and "\n" in x:
                out.append(f"{pad}{key}: |")
                out += [f"{pad}  {line}" if line else "" for line in x.rstrip("\n").split("\n")]
            elif isinstance(x, dict | list):  # empty
                out.append(f"{pad}{key}: {'{}' if isinstance(x, dict) else '[]'}")
            else:
                out.append(f"{pad}{key}: {_scalar(x)}")
        return out
    if isinstance(v, list):
        for x in v:
            sub = _lines(x, indent + 2)
            if isinstance(x, dict | list) and x:
                out.append(f"{pad}- {sub[0].lstrip()}")
                out += sub[1:]
            else:
                out.append(f"{pad}- {_scalar(x)}")
        return out
    return [pad + _scalar(v)]


def dump(doc: dict[str, Any]) -> str:
    """One YAML document."""
    return "\n".join(_lines(doc, 0)) + "\n"


def dump_all(docs: list[dict[str, Any]]) -> str:
    """Several documents in one file (``kubectl apply -f`` takes them all)."""
    return "---\n".join(dump(d) for d in docs)
