"""The layout holds: imports only point down the layers, no import cycles, small modules and functions.

Checked with ``ast`` over the source (function-level and ``if TYPE_CHECKING:`` imports included, for the layers
and the cycles alike: a type is a dependency too, and two modules that type each other are one concern split in
two), so a new arrow against the flow fails here instead of surfacing as an import cycle later.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "disttrain"

# Lower numbers are imported by higher ones, never the reverse. Within one layer, a module may import only
# from its own top-level package (checkpoint and health, say, stay independent of each other).
LAYERS: dict[str, int] = {
    "disttrain.errors": 0,
    "disttrain.utils": 0,
    "disttrain.config": 1,
    "disttrain.models": 2,
    "disttrain.data": 2,
    "disttrain.build": 3,
    "disttrain.parallel": 4,
    "disttrain.rpc": 4,  # the only importer of torch.distributed.rpc
    "disttrain.checkpoint": 5,
    "disttrain.health": 5,
    "disttrain.plan": 6,  # arithmetic only: memory, communication and step time per strategy; `auto`
    "disttrain.train": 7,
    "disttrain.ps": 7,  # the parameter server: beside the LM trainer, never importing it
    "disttrain.rl": 7,  # actors, learner, replay: beside the LM trainer and the parameter server
    "disttrain.launch": 8,  # process launching only: torchrun, multi-node, Slurm
    "disttrain.resolve": 9,  # the job's decisions, made once before any worker starts
    "disttrain.testing": 9,  # test and benchmark helpers, fault injection: above the engines they exercise
    "disttrain.jobs": 10,  # each command's parent side and worker entry: the only layer that starts processes
    "disttrain.report": 10,  # reads run folders: the end of the data flow
    "disttrain.cli": 11,
    "disttrain": 12,  # the package's public face re-exports from everywhere
}


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def layer_key(module: str) -> str:
    """The most specific entry of LAYERS that ``module`` belongs to."""
    keys = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    assert keys, f"{module} is in no layer: add its package to LAYERS in {__file__}"
    return max(keys, key=len)


def imports_of(path: Path, modules: set[str], me: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every disttrain module ``path`` (module ``me``) imports, at any depth, ``if
    TYPE_CHECKING:`` included; ``from pkg import mod`` resolves to ``pkg.mod`` when that is a module."""
    tree = ast.parse(path.read_text())
    me = me or module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        found += [(node.lineno, n) for n in names if n == "disttrain" or n.startswith("disttrain.")]
    return found


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def test_imports_only_point_down_the_layers() -> None:
    modules = all_modules()
    wrong = []
    for me, path in modules.items():
        mine = layer_key(me)
        for line, target in imports_of(path, set(modules)):
            theirs = layer_key(target)
            up = LAYERS[theirs] > LAYERS[mine]
            sideways = LAYERS[theirs] == LAYERS[mine] and theirs.split(".")[1:2] != mine.split(".")[1:2]
            if (up or sideways) and mine != "disttrain":
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line} {me} (layer {LAYERS[mine]}) imports {target} "
                    f"(layer {LAYERS[theirs]})"
                )
    assert not wrong, "imports against the flow:\n" + "\n".join(wrong)


def test_the_parameter_server_and_rpc_stand_apart_from_the_lm_trainer() -> None:
    """ps/ uses rpc/, errors and utils only; torch.distributed.rpc is imported by rpc/transport.py alone."""
    modules = all_modules()
    lm = ("disttrain.train", "disttrain.plan", "disttrain.build", "disttrain.models", "disttrain.launch")
    wrong = [
        f"{me} imports {target}"
        for me, path in modules.items()
        if me.startswith("disttrain.ps")
        for _, target in imports_of(path, set(modules))
        if target.startswith(lm)
    ]
    assert not wrong, wrong
    uses_rpc = re.compile(r"^\s*(import|from) torch\.distributed\.rpc", re.M)
    rpc_users = [m for m, p in modules.items() if uses_rpc.search(p.read_text())]
    assert rpc_users == ["disttrain.rpc.transport"]


def test_no_import_cycles() -> None:
    modules = all_modules()
    graph = {m: {t for _, t in imports_of(p, set(modules)) if t in modules and t != m} for m, p in modules.items()}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles (type-only imports included):\n" + "\n".join(cycles)


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each cycle a depth-first walk of ``graph`` (module -> the modules it imports) meets, as 'a -> b -> a'."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def python_files() -> list[Path]:
    return [p for d in ("src", "benchmarks", "tests") for p in sorted((ROOT / d).rglob("*.py"))]


def test_size_is_kept_by_complexity_rules_and_the_formatter_owns_layout() -> None:
    """Functions are bounded by ruff's complexity rules (in ``make lint``), not by line counts; ``# fmt: skip``
    appears only on a table that needs it, with its reason on the same line."""
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"C90", "PLR0912", "PLR0915"} <= set(lint["select"])
    assert lint["mccabe"]["max-complexity"] <= 10
    bare = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in python_files()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip")
    ]
    assert not bare, f"# fmt: skip without a reason (the formatter owns layout): {bare}"


def test_every_module_says_what_it_owns() -> None:
    missing = [str(p.relative_to(ROOT)) for p in SRC.rglob("*.py") if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"


def test_the_checks_catch_what_they_guard(tmp_path: Path) -> None:
    """The checkers themselves: an upward function-level import and a TYPE_CHECKING one, both counted; a cycle
    closed by a type-only import is one."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from disttrain.cli import main\n\n\n"
        "def f() -> None:\n    from disttrain.train import trainer\n"
    )
    mods = {"disttrain.train.trainer", "disttrain.parallel.probe", "disttrain.cli"}
    found = imports_of(probe, mods, me="disttrain.parallel.probe")
    assert found == [(4, "disttrain.cli"), (8, "disttrain.train.trainer")]
    assert LAYERS[layer_key(found[1][1])] > LAYERS[layer_key("disttrain.parallel.probe")]
    typed = {"disttrain.cli": {"disttrain.parallel.probe"}, "disttrain.parallel.probe": {t for _, t in found}}
    assert find_cycles({**typed, "disttrain.train.trainer": set()}) == [
        "disttrain.cli -> disttrain.parallel.probe -> disttrain.cli"
    ]


def test_ruff_checks_every_source_file() -> None:
    """ruff's default excludes (``dist``, ``build``, ...) must not hide a package: every ``.py`` under src/,
    tests/ and benchmarks/ is in the file list ``make lint`` checks."""
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    out = subprocess.run(
        [ruff, "check", "--show-files", "src", "tests", "benchmarks", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seen = {Path(line.strip()).resolve() for line in out.splitlines() if line.strip().endswith(".py")}
    missing = [str(p.relative_to(ROOT)) for p in python_files() if p.resolve() not in seen]
    assert not missing, f"ruff never checks these files (an excluded folder name?): {missing}"


STRATEGY_NAME = r"\"(single|ddp|fsdp|hsdp|fsdp_no_reshard|fsdp_offload)\""
NAME_COMPARISON = re.compile(
    rf"(==|!=)\s*{STRATEGY_NAME}|{STRATEGY_NAME}\s*(==|!=)|\bin\s*\(\s*{STRATEGY_NAME}|\bin\s+SHARDED\b"
)


def test_no_strategy_name_is_compared_outside_the_registry() -> None:
    """Strategies are objects (disttrain.parallel.strategies): code asks them, it does not compare names."""
    home = SRC / "parallel" / "strategies"
    ps = SRC / "ps"  # the parameter server's dense part has its own modes (ddp | server): not LM strategies
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in sorted(SRC.rglob("*.py"))
        if home not in p.parents and ps not in p.parents
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if NAME_COMPARISON.search(line)
    ]
    assert not found, "strategy names compared outside the registry (ask the Strategy instead):\n" + "\n".join(found)
    assert NAME_COMPARISON.search('if strategy == "hsdp":') and NAME_COMPARISON.search('x in ("single", "ddp")')
