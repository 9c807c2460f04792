"""The docs hold: every command in README.md and docs/*.md runs, every TOML example loads, the configuration
reference is the one the config dataclasses generate, the architecture page's layer table is the layout test's,
every option named exists, and every link between pages resolves.

Commands are the ``disttrain ...`` (and ``make ...``) invocations in the pages' ```bash blocks, shell variables
set in the block expanded. Each gets a check by what it is (:func:`mode_of`); a command that gets none fails
``test_every_command_in_the_docs_has_a_check``: there are no silent skips. They run in one process
(``doc_commands.py``) in a folder of fixtures: the files the commands name (``job.toml``, ``mymod.py``, ``mydata.py``:
the pages' own examples of them), a tiny ``gpt2-folder`` and a seed checkpoint in ``runs/r``.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*PAGES, ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "HISTORY.md"]
DRIVER = Path(__file__).with_name("doc_commands.py")
CORPUS = ROOT / "src" / "disttrain" / "data" / "shakespeare.txt.gz"
FIXTURE_FILES = ("job.toml", "mymod.py", "mydata.py")  # the pages' own examples, by their first-line label


@dataclasses.dataclass(frozen=True)
class DocCommand:
    page: str
    line: int
    argv: tuple[str, ...]
    """What follows ``disttrain`` (or ``("make", target, ...)``)."""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def code_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, line number of the first line inside, body) of every fenced block, in order."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            found.append((lines[i][3:].strip(), i + 2, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return found


def fenced(text: str, lang: str) -> list[tuple[int, str]]:
    """(line number of the first line inside, body) of every ```lang block."""
    return [(n, body) for kind, n, body in code_blocks(text) if kind == lang]


def logical_lines(body: str, first: int) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending, start = "", first
    for n, line in enumerate(body.splitlines(), first):
        if not pending:
            start = n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def commands_in(page: Path) -> list[DocCommand]:
    name = str(page.relative_to(ROOT))
    found = []
    for first, body in fenced(page.read_text(), "bash"):
        variables: dict[str, list[str]] = {}
        for n, line in logical_lines(body, first):
            if m := re.fullmatch(r'\s*([A-Z_]+)="(.*)"\s*', line):
                variables[m.group(1)] = shlex.split(m.group(2))
                continue
            tokens: list[str] = []
            for tok in shlex.split(line, comments=True):
                tokens += variables.get(tok[1:], [tok]) if tok.startswith("$") else [tok]
            tokens = [t for t in tokens if t != "&"]
            if tokens[:1] == ["make"]:
                found.append(DocCommand(name, n, tuple(tokens)))
            at = next((i for i, t in enumerate(tokens) if t == "disttrain" or t.endswith("/disttrain")), None)
            if at is not None:
                found.append(DocCommand(name, n, tuple(tokens[at + 1 :])))
    return found


COMMANDS = [c for page in PAGES for c in commands_in(page)]
MISTAKES = [  # (mode, argv) that must fail: a check that passed these would check nothing
    ("real", ["run", "--train.stepz", "3", "--print-config"]),
    ("measure", ["estimate", "--measure", "--parallel.nproc", "two"]),
    ("real", ["ckpt", "verify", "runs/nothing"]),
    ("doctor", ["doctor", "--quik"]),
    ("parse", ["launch", "--nnodes"]),
    ("ps", ["ps", "--ps.servrs", "2"]),
    ("ps", ["ps", "--servers", "2"]),  # the flat flags before the sections
    ("rl", ["rl", "--rl.env-id", "Nope-v0"]),
]


def mode_of(cmd: DocCommand) -> tuple[str, list[str]] | None:
    """How a command is checked and the arguments it runs with; None: no check (a failure)."""
    argv = list(cmd.argv)
    sub = argv[0] if argv else ""
    if sub == "make":
        return "make", argv
    if sub == "run":  # --print-config resolves and checks the whole job, plan included
        if "--help" in argv or "--slurm" in argv or "--k8s" in argv:  # they only write a script or a manifest
            return "real", argv
        return "real", argv if "--print-config" in argv else [*argv, "--print-config"]  # nothing trains
    if sub == "estimate":
        return ("measure" if "--measure" in argv else "real"), argv
    if sub == "ckpt":
        return "real", argv  # against the seed checkpoint runs/r
    if sub == "data":  # prepare (on the fixtures' notes.txt) and verify run for real: a second each
        return "real", argv
    if sub in ("ps", "rl", "doctor"):  # their command line only: doctor starts workers or waits for nodes
        return ("real" if "--k8s" in argv else sub), argv  # --k8s only writes a manifest
    if sub == "launch":
        return ("real" if "--slurm" in argv or "--k8s" in argv else "parse"), argv  # they only write a file
    if sub == "report":
        return "parse", argv  # report --live serves forever
    return None


def labelled_block(label: str, lang: str) -> str:
    """The one block (across the pages) whose first line is ``# LABEL`` (``# LABEL: ...``)."""
    blocks = [
        body
        for page in PAGES
        for _, body in fenced(page.read_text(), lang)
        if re.match(rf"# {re.escape(label)}\b", body)
    ]
    assert len(blocks) == 1, f"expected exactly one ```{lang} block starting with '# {label}' in the docs"
    return blocks[0] + "\n"


def write_fixtures(folder: Path) -> None:
    for name in FIXTURE_FILES:
        (folder / name).write_text(labelled_block(name, "toml" if name.endswith(".toml") else "python"))
    (folder / "notes.txt").write_text(gzip.decompress(CORPUS.read_bytes()).decode()[:30_000])
    (folder / "train.py").write_text("print('hello from train.py')\n")


def child_env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(ROOT / "src"), str(folder), env.get("PYTHONPATH", "")]
    env.update(PYTHONPATH=os.pathsep.join(p for p in path if p), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(DISTTRAIN_CACHE_DIR=str(folder / "cache"), TRANSFORMERS_VERBOSITY="error")
    return env


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """{rc, out} of every command (and of MISTAKES), keyed by json.dumps([mode, argv]): a command that appears
    on several pages runs once."""
    folder = tmp_path_factory.mktemp("docs-fixtures")
    write_fixtures(folder)
    runs = [mode_of(c) for c in COMMANDS] + MISTAKES
    keys = dict.fromkeys(json.dumps(list(how)) for how in runs if how is not None and how[0] != "make")
    spec = [{"key": key, "mode": json.loads(key)[0], "argv": json.loads(key)[1]} for key in keys]
    (folder / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(folder), str(folder / "spec.json"), str(folder / "out.json")],
        env=child_env(folder),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((folder / "out.json").read_text())


def test_every_command_in_the_docs_has_a_check() -> None:
    unchecked = [f"{c.id}: disttrain {' '.join(c.argv)}" for c in COMMANDS if mode_of(c) is None]
    assert not unchecked, "commands in the docs that no check covers (add one to mode_of):\n" + "\n".join(unchecked)
    for page in PAGES:  # the collector misses nothing: every bash line that calls disttrain became a command
        calls = [
            line
            for first, body in fenced(page.read_text(), "bash")
            for line in logical_lines(body, first)
            if re.search(r"(^|[\s/])disttrain\s", line[1].split("#")[0])
        ]
        mine = [c for c in COMMANDS if c.page == str(page.relative_to(ROOT)) and c.argv[:1] != ("make",)]
        assert len(mine) == len(calls), page
    subcommands = {c.argv[0] for c in COMMANDS}
    assert subcommands >= {"run", "estimate", "ckpt", "ps", "rl", "doctor", "report", "launch", "make"}, subcommands


@pytest.mark.slow
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_docs_command_runs(cmd: DocCommand, request: pytest.FixtureRequest) -> None:
    how = mode_of(cmd)
    assert how is not None, f"no check for {cmd.id}"
    if how[0] == "make":
        proc = subprocess.run(["make", "-n", *how[1][1:]], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, f"{cmd.id}: `{' '.join(cmd.argv)}`: {proc.stderr}"
        return
    result = request.getfixturevalue("results")[json.dumps(list(how))]
    shown = " ".join(["disttrain", *how[1]])
    assert result["rc"] == 0, f"{cmd.id}: `{shown}` ({how[0]}) exited {result['rc']}:\n{result['out']}"


@pytest.mark.slow
def test_the_checks_fail_on_a_mistake(request: pytest.FixtureRequest) -> None:
    """Each kind of check fails on a wrong option or value, as the real commands do (these ran beside the docs')."""
    results = request.getfixturevalue("results")
    for mode, argv in MISTAKES:
        assert results[json.dumps([mode, argv])]["rc"] != 0, (mode, argv)


def test_every_toml_example_loads(tmp_path: Path) -> None:
    from disttrain.config import load_toml

    blocks = [(page, n, body) for page in PAGES for n, body in fenced(page.read_text(), "toml")]
    assert len(blocks) >= 3
    for page, n, body in blocks:
        path = tmp_path / "example.toml"
        path.write_text(body + "\n")
        load_toml(str(path))  # ConfigError (unknown key, wrong type, a failed check) fails the test
        assert body, f"{page}:{n}"


def load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_generated_from_the_config() -> None:
    gen = load_script(ROOT / "scripts" / "gen_config_docs.py")
    _, generated_part = gen.split_page((ROOT / "docs" / "configuration.md").read_text())
    assert generated_part == gen.generated(), (
        "docs/configuration.md is out of date with the config dataclasses: run `python scripts/gen_config_docs.py`"
    )


def test_the_reference_lists_every_field_with_its_default() -> None:
    from disttrain.config import JobConfig, known_keys
    from disttrain.config.reference import render_reference

    text = render_reference()
    for key in known_keys():
        assert f"| `--{key}` |" in text, key
    assert "| `--train.steps` | int | `300` | Optimizer steps. |" in text
    assert "| `--parallel.strategy` | auto \\| single \\| ddp \\| fsdp \\| hsdp | `auto` |" in text
    assert JobConfig.__doc__ and "### `[health]`" in text


def test_the_architecture_layer_table_is_the_layout_tests() -> None:
    layers = load_script(ROOT / "tests" / "layout" / "test_layout.py").LAYERS
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page.split("<!-- layers:begin -->")[1].split("<!-- layers:end -->")[0]
    rows = re.findall(r"^\| `([\w.]+)` \| (\d+) \|", table, flags=re.M)
    documented = {name: int(layer) for name, layer in rows}
    assert len(rows) == len(documented), "a package is listed twice"
    assert documented == layers, (
        "docs/architecture.md's layer table differs from LAYERS in tests/layout/test_layout.py: "
        f"only in the page {sorted(documented.items() - layers.items())}, "
        f"only in the test {sorted(layers.items() - documented.items())}"
    )


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped except - and _, spaces to hyphens."""
    heads = re.findall(r"^#{1,6} (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_link_between_pages_resolves() -> None:
    broken = []
    for page in LINKED:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_option_the_docs_name_exists() -> None:
    """``--section.key`` anywhere in the pages is a key of one of the jobs (``run``, ``ps``, ``rl``, ``doctor``);
    on the ps and rl pages every other ``--option`` is one of the command's own flags."""
    from disttrain.cli import ps
    from disttrain.config import COMMON_FLAGS, JobConfig, known_keys, section_types
    from disttrain.config.doctor import DoctorJobConfig
    from disttrain.ps.config import PSJobConfig
    from disttrain.rl.config import RLJobConfig

    jobs = (JobConfig, PSJobConfig, RLJobConfig, DoctorJobConfig)
    keys = {k for job in jobs for k in known_keys(job)}
    sections = {s for job in jobs for s in section_types(job)}
    unknown = []
    for page in PAGES:
        outputs = [body for kind, _, body in code_blocks(page.read_text()) if not kind]  # error lines shown
        text = functools.reduce(lambda t, body: t.replace(body, ""), outputs, page.read_text())
        for section, key in re.findall(r"--([a-z]+)\.([a-z][a-z0-9_-]*)", text):
            name = key.replace("-", "_")
            if section in sections and f"{section}.{name}" not in keys and f"{section}.{name[3:]}" not in keys:
                unknown.append(f"{page.name}: --{section}.{key}")
    for page, flags in (("parameter-server.md", ps.FLAGS), ("reinforcement-learning.md", ())):
        own = {f.name for f in (*COMMON_FLAGS, *flags)} | {"--help"}
        for flag in re.findall(r"(?<![\w.-])--([a-z][a-z-]*)(?![\w.])", (ROOT / "docs" / page).read_text()):
            if f"--{flag}" not in own:
                unknown.append(f"{page}: --{flag}")
    assert not unknown, "options the docs name that do not exist:\n" + "\n".join(unknown)


def test_the_readme_is_the_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md is the front door: keep it <= 150 lines; guides go in docs/"
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


def test_the_performance_page_holds_current_figures_only() -> None:
    """Dated runs belong in benchmarks/HISTORY.md; the page names a benchmark script for its figures."""
    page = (ROOT / "docs" / "performance.md").read_text()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", page), (
        "docs/performance.md: move dated runs to benchmarks/HISTORY.md"
    )
    assert "Recommendations" not in page
    scripts = set(re.findall(r"`(bench_\w+\.py)", page))
    assert scripts and all((ROOT / "benchmarks" / s).is_file() for s in scripts), scripts
