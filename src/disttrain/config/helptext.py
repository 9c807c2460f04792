"""The ``--help`` view of a job config of sections: the same dataclasses with their docstrings made terminal text.

The docstrings are written for the reference too (docs/configuration.md): reST's ``x`` becomes 'x', a paragraph
becomes one line that the help's box wraps, and a field that is unset (None) by default and says what that
means ("(default: the bundled Shakespeare corpus)") shows that as its one default, not tyro's "(default: None)"
after it. :func:`help_view` makes copies of the sections whose fields carry this text (``tyro.conf.arg``); only
``--help`` uses them, parsing uses the real classes.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from typing import Annotated, Any

from disttrain.config.job import section_types
from disttrain.config.reference import field_docs

_DEFAULT = re.compile(r"\s*\(default:? ([^()]*(?:\([^()]*\)[^()]*)*)\)")  # one level of nested parentheses


def terminal_text(doc: str) -> str:
    """A docstring as one line of terminal text: whitespace collapsed, reST's ``x`` as 'x'."""
    return re.sub(r"``(.+?)``", r"'\1'", " ".join(doc.split()))


def split_default(doc: str) -> tuple[str, str | None]:
    """'A file (default: the corpus).' -> ('A file.', 'the corpus'); (doc, None) when it names no default."""
    m = _DEFAULT.search(doc)
    if m is None:
        return doc, None
    return (doc[: m.start()] + doc[m.end() :]).strip(), m.group(1).strip()


def _field_arg(doc: str, default: Any) -> Any:
    """tyro's per-field settings: the help text, and the docstring's own default when the value is unset."""
    import tyro

    text, said = split_default(terminal_text(doc))
    if said is not None and default is None:
        return tyro.conf.arg(help=text, help_behavior_hint=f"(default: {said})")
    return tyro.conf.arg(help=text)  # set (by a TOML file): tyro's "(default: value)" is the one that holds


def _section_view(cls: type, value: Any) -> Any:
    """A copy of the section dataclass ``cls`` whose fields carry their help text, holding ``value``'s values."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    fields = []
    for f in dataclasses.fields(cls):
        current = getattr(value, f.name)
        if f.name in docs:
            fields.append((f.name, Annotated[hints[f.name], _field_arg(docs[f.name], current)]))
        else:
            fields.append((f.name, hints[f.name]))
    doc = terminal_text(inspect.getdoc(cls) or "")
    view = dataclasses.make_dataclass(cls.__name__, fields, namespace={"__doc__": doc})
    return view(**{f.name: getattr(value, f.name) for f in dataclasses.fields(cls)})


def help_view(job: type, default: Any) -> tuple[type, Any]:
    """``job`` (a dataclass of sections) as a dataclass for tyro's ``--help``, and ``default`` (a ``job``) as one
    of it: the same options and defaults, the help text clean."""
    sections = {name: _section_view(cls, getattr(default, name)) for name, cls in section_types(job).items()}
    fields = [(name, type(value)) for name, value in sections.items()]
    doc = terminal_text(inspect.getdoc(job) or "")
    view = dataclasses.make_dataclass(job.__name__, fields, namespace={"__doc__": doc})
    return view, view(**sections)
