"""Every command's ``--help``, as a new user reads it: clean text (no reST ``x`` markup, one "(default: ...)" per
option), and quick, because it imports none of the heavy libraries (torch, numpy, matplotlib, transformers) that
only the job itself needs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import child_env, disttrain

pytestmark = pytest.mark.timeout(120)

COMMANDS = [
    ["run"],
    ["estimate"],
    ["ps"],
    ["rl"],
    ["doctor"],
    ["launch"],
    ["report"],
    ["ckpt"],
    *(["ckpt", action] for action in ("ls", "inspect", "verify", "export")),
    ["data"],
    *(["data", action] for action in ("prepare", "verify")),
]

_OPTION = re.compile(r"^\s*(-\w, )?--[\w.-]+")  # the line an option's entry starts with (help's boxes stripped)


def option_texts(help_text: str) -> list[str]:
    """Each option's entry of a help page as one string (its name line and the description under it)."""
    entries: list[list[str]] = [[]]
    for raw in help_text.splitlines():
        line = raw.strip(" │╭╮╰╯─")
        if _OPTION.match(line) or not line:
            entries.append([])
        entries[-1].append(line)
    return [" ".join(e) for e in entries if e]


def test_option_texts_splits_entries() -> None:
    page = "│ --a INT     │\n│   Text (default:  │\n│   1).     │\n│ --b   Other. (default: 2) │\n"
    assert option_texts(page) == ["--a INT Text (default: 1).", "--b   Other. (default: 2)"]


@pytest.mark.parametrize("command", [" ".join(c) for c in COMMANDS])
def test_help_text_is_clean(command: str) -> None:
    proc = disttrain(*command.split(), "--help", env={"COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    page = proc.stdout
    assert "--help" in page
    assert "``" not in page, [line for line in page.splitlines() if "``" in line]
    doubled = [text for text in option_texts(page) if text.count("(default:") > 1]
    assert not doubled, doubled


def test_docstring_default_replaces_none() -> None:
    """A field left unset (None) whose docstring says what unset means: that is its one default in --help."""
    (entry,) = [t for t in option_texts(disttrain("run", "--help").stdout) if t.startswith("--data.path ")]
    assert " ".join(entry.split()).endswith("data prepare`. (default: the bundled Shakespeare corpus)"), entry


_IMPORTS = """
import contextlib, io, json, sys
from disttrain.cli import _main
seen = {}
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = _main(argv)
        except SystemExit as e:
            code = e.code
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy", "matplotlib", "transformers"})
    seen[" ".join(argv)] = [code, heavy]
print(json.dumps(seen))
"""


def test_help_and_bad_options_import_no_heavy_library() -> None:
    """--help and a mistyped option are answered before torch (1-2 s of imports) is loaded: one process runs every
    command's help, then the mistakes, and reports what each had imported."""
    lines = [[*c, "--help"] for c in COMMANDS]
    lines += [["run", "--train.steps", "ten"], ["run", "--train.stepz", "5"], ["ps", "--ps.sever", "2"]]
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTS, json.dumps(lines)], env=child_env(), capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    for argv in lines:
        code, heavy = seen[" ".join(argv)]
        assert code in (0, 2), (argv, code)
        assert heavy == [], f"`disttrain {' '.join(argv)}` imported {heavy}"
