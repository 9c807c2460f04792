"""Names of a package that load on first use (PEP 562): a process that never touches them does not pay for
their imports (FSDP, DTensor, DCP: about a second each on a small machine)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, where: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` for ``package``: ``where`` maps each name to the module defining it; a name,
    once loaded, is kept in ``namespace`` (the package's globals) so the next lookup is a plain one."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    return __getattr__
