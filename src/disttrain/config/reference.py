"""The configuration reference of docs/configuration.md, rendered from the config dataclasses themselves.

Every field of a section has a docstring on the line(s) after it (habit 2); this module reads those with
``ast`` from the source, the defaults from ``dataclasses.fields`` and the types from the annotations, and
renders one markdown table per section: option, type, default, meaning. ``scripts/gen_config_docs.py``
writes it into docs/configuration.md (with the ``disttrain ps`` and ``disttrain rl`` jobs, which live above
this layer: their own sections as tables, the ones they share with ``run`` as links), and a test fails when the
page and the dataclasses disagree, so the reference cannot drift.

Imports only ``disttrain.config`` (layer 1).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from disttrain.config.job import JobConfig, section_types

MISSING_DOC = "(no description)"


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in ``cls``'s source (one line, whitespace collapsed)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def field_types(cls: type) -> dict[str, ast.expr]:
    """Field name -> its annotation as written (an ``ast`` expression: the module uses postponed annotations)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    return {s.target.id: s.annotation for s in body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def type_text(node: ast.expr) -> str:
    """An annotation as a reader types values: ``Literal['a', 'b']`` -> ``a | b``, ``int | None`` -> ``int | none``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return f"{type_text(node.left)} | {type_text(node.right)}"
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal":
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return " | ".join(str(ast.literal_eval(i)) for i in items)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "tuple":
        inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
        return f"{type_text(inner)} ..."
    if isinstance(node, ast.Constant) and node.value is None:
        return "none"
    return ast.unparse(node)


def default_text(field: dataclasses.Field[Any]) -> str:
    """The default as it is written on the command line / in TOML (strings unquoted; ``none``: not set)."""
    value = field.default
    if value is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def cell(text: str) -> str:
    """Text for one markdown table cell: reST's ``x`` as `x`, pipes escaped."""
    return re.sub(r"``(.+?)``", r"`\1`", text).replace("|", "\\|")


def render_options(cls: type, prefix: str) -> str:
    """One table: every field of ``cls`` as ``--PREFIXfield``."""
    docs, types = field_docs(cls), field_types(cls)
    rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        option, kind = f"`--{prefix}{f.name}`", cell(type_text(types[f.name]))
        rows.append(f"| {option} | {kind} | `{cell(default_text(f))}` | {cell(docs.get(f.name, MISSING_DOC))} |")
    return "\n".join(rows)


def render_reference(commands: Sequence[tuple[str, type]] = ()) -> str:
    """The reference as markdown: a section per field of :class:`JobConfig` (``disttrain run``, ``estimate``),
    then one per entry of ``commands`` (title, the command's job config of sections)."""
    sections = section_types()
    shared = {t: f"[`[{name}]`](#{name})" for name, t in sections.items()}
    parts = []
    for name, cls in sections.items():
        intro = cell(inspect.getdoc(cls) or "")
        parts.append(f"### `[{name}]`\n\n{intro}\n\n{render_options(cls, name + '.')}\n")
    parts += [render_command(title, job, shared) for title, job in commands]
    head = (
        f"## Reference\n\n{cell(inspect.getdoc(JobConfig) or '')} Sections, in order: "
        + ", ".join(f"[`{n}`](#{n})" for n in sections)
        + (", and the sections of " + ", ".join(f"`{t}`" for t, _ in commands) if commands else "")
        + ".\n"
    )
    return "\n".join([head, *parts])


def render_command(title: str, job: type, shared: dict[type, str]) -> str:
    """A command's job of sections: a table per section of its own, a link for each it shares with ``disttrain
    run`` (``shared``: section type -> where it is described)."""
    own, same = [], []
    for name, cls in section_types(job).items():
        if cls in shared:
            same.append(f"{shared[cls]} (`--{name}.*`)")
            continue
        intro = cell(inspect.getdoc(cls) or "")
        own.append(f"#### `{title}` `[{name}]`\n\n{intro}\n\n{render_options(cls, name + '.')}\n")
    intro = cell(" ".join((inspect.getdoc(job) or "").split()))
    tail = f"The sections it shares with `disttrain run`: {', '.join(same)}.\n" if same else ""
    return "\n".join([f"### `{title}`\n\n{intro}\n", *own, tail])
