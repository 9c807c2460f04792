"""A job config from and to TOML (or the same nested dicts): unknown sections and keys, and values of the wrong
type, are errors that name the key, the value and the closest known key.

A job config is a dataclass of sections (each a dataclass of plain values): :class:`JobConfig` for ``run`` and
``estimate``, the parameter server's and RL's own for ``ps`` and ``rl``; ``job=`` says which (default JobConfig).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, TypeVar, overload

from disttrain.config.job import JobConfig, known_keys, section_types
from disttrain.config.typecheck import check_fields
from disttrain.config.values import suggest
from disttrain.errors import ConfigError

J = TypeVar("J")


@overload
def from_dict(raw: dict[str, Any], source: str = ...) -> JobConfig: ...
@overload
def from_dict(raw: dict[str, Any], source: str = ..., *, job: type[J]) -> J: ...
def from_dict(raw: dict[str, Any], source: str = "config", *, job: type[Any] = JobConfig) -> Any:
    """Build a ``job`` config from nested dicts (TOML layout); unknown keys are errors naming the closest key, and
    every value is checked against its field's type ('train.steps must be an integer, got 'ten'')."""
    sections = section_types(job)
    kwargs: dict[str, Any] = {}
    for sec, body in raw.items():
        if sec not in sections:
            raise ConfigError(f"{source}: unknown section [{sec}]{suggest(sec, list(sections))}")
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: [{sec}] must be a table, got {type(body).__name__}")
        fields = {f.name for f in dataclasses.fields(sections[sec])}
        for key in body:
            if key not in fields:
                raise ConfigError(f"{source}: unknown key {sec}.{key}{suggest(f'{sec}.{key}', known_keys(job))}")
        try:
            values = check_fields(sections[sec], body, sec)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        try:
            kwargs[sec] = sections[sec](**values)
        except TypeError as e:  # wrong value types surface here only in odd cases
            raise ConfigError(f"{source}: [{sec}]: {e}") from None
    return job(**kwargs)


@overload
def load_toml(path: str | Path) -> JobConfig: ...
@overload
def load_toml(path: str | Path, *, job: type[J]) -> J: ...
def load_toml(path: str | Path, *, job: type[Any] = JobConfig) -> Any:
    """Read a TOML job file (of ``job``'s sections)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass a path to a .toml file")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    return from_dict(raw, source=str(p), job=job)


def to_dict(cfg: Any) -> dict[str, dict[str, Any]]:
    """Nested dict of a job config (TOML layout)."""
    return dataclasses.asdict(cfg)


def to_toml(cfg: Any) -> str:
    """Serialise to TOML (None values are omitted: they mean 'default')."""
    lines: list[str] = []
    for sec, body in to_dict(cfg).items():
        lines.append(f"[{sec}]")
        for key, val in body.items():
            if val is not None:
                lines.append(f"{key} = {_toml_value(val)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} to TOML")
