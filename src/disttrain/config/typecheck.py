"""Values from TOML (or any plain dict) checked against the annotations of the dataclass fields they fill.

Driven by :func:`typing.get_type_hints`, so a new field needs nothing here: ints, floats (an int is fine for a
float, and becomes one), bools, strings, ``Literal`` choices, ``X | None``, lists / tuples / sets, dicts and
nested dataclasses. A mismatch is a :class:`ConfigError` like ``train.steps must be an integer, got 'ten'``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from disttrain.errors import ConfigError

_NO = object()  # "does not fit": the caller says what was expected
_NAMES: dict[Any, tuple[str, str]] = {
    bool: ("true or false", "true/false values"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
}
_SEQUENCES = (list, tuple, set, frozenset)


def check_fields(cls: type, body: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``body`` (field -> value) with every value checked against its annotation in dataclass ``cls``; keys
    are named ``prefix.field`` in errors; keys that are not fields pass through (the caller rejects them)."""
    hints = typing.get_type_hints(cls)
    return {k: coerce(v, hints[k], f"{prefix}.{k}") if k in hints else v for k, v in body.items()}


def coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` if it fits ``hint`` (an int where a float is wanted becomes a float), else ConfigError."""
    out = _fit(value, hint, key)
    if out is _NO:
        raise ConfigError(f"{key} must be {describe(hint)}, got {value!r}")
    return out


def describe(hint: Any, plural: bool = False) -> str:
    """What ``hint`` accepts, in words ('an integer', "one of 'a', 'b'", 'a list of strings')."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and hint in _NAMES:
        return _NAMES[hint][plural]
    if origin is Literal:
        return ("values in " if plural else "one of ") + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a, plural) for a in args if a is not type(None))
    if origin in _SEQUENCES or hint in _SEQUENCES:
        lists = "lists" if plural else "a list"
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: fixed length
            return f"{lists} of {len(args)} values ({', '.join(describe(a) for a in args)})"
        return f"{lists} of {describe(args[0], plural=True)}" if args else lists
    if origin is dict or hint is dict or dataclasses.is_dataclass(hint):
        return "tables" if plural else "a table"
    name = getattr(hint, "__name__", str(hint))
    return f"{name} values" if plural else f"a {name}"


def _fit(value: Any, hint: Any, key: str) -> Any:
    """``value`` made to fit ``hint``, or ``_NO``; errors inside containers name the element."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin is Literal:
        return value if any(value == a and type(value) is type(a) for a in args) else _NO
    if origin in (Union, types.UnionType):
        return _fit_union(value, args, key)
    if isinstance(hint, type) and hint in _NAMES:
        return _fit_scalar(value, hint)
    if origin in _SEQUENCES or hint in _SEQUENCES:
        return _fit_sequence(value, origin or hint, args, key)
    if origin is dict or hint is dict:
        return _fit_dict(value, args, key)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _fit_dataclass(value, hint, key)
    if isinstance(hint, type):
        return value if isinstance(value, hint) else _NO
    return value  # a form this does not know: the dataclass's own checks decide


def _fit_dict(value: Any, args: tuple[Any, ...], key: str) -> Any:
    if not isinstance(value, dict):
        return _NO
    kt, vt = args or (Any, Any)
    return {coerce(k, kt, f"{key} (a key)"): coerce(v, vt, f"{key}.{k}") for k, v in value.items()}


def _fit_dataclass(value: Any, hint: type, key: str) -> Any:
    if isinstance(value, hint):
        return value
    if not isinstance(value, dict):
        return _NO
    names = {f.name for f in dataclasses.fields(hint)}  # type: ignore[arg-type]
    unknown = sorted(set(value) - names)
    if unknown:
        raise ConfigError(f"unknown key {key}.{unknown[0]}; known: {', '.join(sorted(names))}")
    return hint(**check_fields(hint, value, key))


def _fit_scalar(value: Any, hint: type) -> Any:
    if isinstance(value, bool):  # bool is an int to Python, never to a config
        return value if hint is bool else _NO
    if hint is float and isinstance(value, int):
        return float(value)
    return value if isinstance(value, hint) else _NO


def _fit_union(value: Any, args: tuple[Any, ...], key: str) -> Any:
    if value is None:
        return None if type(None) in args else _NO
    for arm in args:
        if arm is type(None):
            continue
        try:
            out = _fit(value, arm, key)
        except ConfigError:
            continue
        if out is not _NO:
            return out
    return _NO


def _fit_sequence(value: Any, kind: type, args: tuple[Any, ...], key: str) -> Any:
    if not isinstance(value, _SEQUENCES):
        return _NO
    items = list(value)
    if kind is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: fixed length
        if len(items) != len(args):
            return _NO
        return tuple(coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(items, args, strict=True)))
    inner = args[0] if args else Any
    return kind(coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(items))
