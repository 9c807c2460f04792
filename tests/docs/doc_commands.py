"""Runs the docs' ``disttrain`` commands for tests/docs/test_docs.py, all in this one process (torch and
transformers are imported once, not once per command), in a folder of fixtures the commands name.

    python doc_commands.py FIXTURE_DIR SPEC.json OUT.json

SPEC.json is a list of ``{"key", "argv", "mode"}``; OUT.json maps each key to ``{"rc", "out"}``. Modes:

- ``real``: ``disttrain ARGV`` as a user runs it (``run ... --print-config``, ``estimate``, ``ckpt``, ``--slurm``).
- ``measure``: ``disttrain estimate --measure ...`` with the measuring itself replaced (it starts workers per
  strategy: ~40 s; ``tests/plan/test_memory_measure.py`` runs it): the arguments and the plan run for real.
- ``parse``: the command's own argument parser, for commands that would start workers, wait for other nodes or
  serve forever (``report``, ``launch``): it stops right after a successful parse.
- ``ps`` / ``rl`` / ``doctor``: the command's job parsed from the arguments as the command parses it (``--config``, the
  ``--section.key`` options, its own flags; ``rl``: and its environment looked up).

Before the commands, it makes the fixtures that need torch: ``gpt2-folder`` (a tiny Hugging Face GPT-2 written
with ``save_pretrained``, whose config ``mymod.py`` reads) and ``runs/r``, a seed checkpoint of ``mymod:build``
(made by a real ``disttrain run`` in the background while the commands that do not read ``runs/`` run),
with ``runs/seed`` pointing at it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock


class Parsed(Exception):
    """Raised by the patched ``parse_args`` once the arguments parsed: the command stops there."""


@contextlib.contextmanager
def parse_only() -> Iterator[None]:
    real = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        raise Parsed(real(self, *args, **kwargs))

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_args):
        yield


@contextlib.contextmanager
def measuring_replaced() -> Iterator[None]:
    """``estimate --measure`` without its launches: where the measuring lives may move, so look it up."""
    import importlib

    for name in ("disttrain.plan.command", "disttrain.jobs.estimate"):
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            if hasattr(module, "measure_here"):
                with mock.patch.object(module, "measure_here", return_value=("(measuring not run here)", {})):
                    yield
                return
    raise RuntimeError("estimate --measure: no measure_here to replace; update tests/docs/doc_commands.py")


def run_command(argv: list[str], mode: str) -> int:
    from disttrain.cli import main

    if mode == "ps":
        from disttrain.cli import ps
        from disttrain.config import parse_command
        from disttrain.ps.config import PSJobConfig

        parse_command(PSJobConfig, argv[1:], "disttrain ps", ps.SUMMARY, ps.FLAGS)
        return 0
    if mode == "doctor":  # the checks start workers or wait for other nodes: the command line only
        from disttrain.cli import doctor
        from disttrain.config import parse_command
        from disttrain.config.doctor import DoctorJobConfig

        parse_command(DoctorJobConfig, argv[1:], "disttrain doctor", doctor.SUMMARY, doctor.FLAGS)
        return 0
    if mode == "rl":
        from disttrain.cli import rl
        from disttrain.config import parse_command
        from disttrain.rl.config import RLJobConfig
        from disttrain.rl.envs import env_spec

        line = parse_command(RLJobConfig, argv[1:], "disttrain rl", rl.SUMMARY, rl.FLAGS)
        if line is not None:
            env_spec(line.cfg.rl.env_id)
        return 0
    context = {"parse": parse_only, "measure": measuring_replaced}.get(mode, contextlib.nullcontext)
    with context():
        try:
            return main(argv)
        except Parsed:
            return 0


def run_captured(argv: list[str], mode: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = run_command(argv, mode)
        except SystemExit as e:  # argparse and tyro exit on a bad option (2) or after --help (0)
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # ConfigError from ps/rl parsing, or a bug: either fails the test, with the traceback
            traceback.print_exc()
            rc = 1
    return {"rc": rc, "out": out.getvalue()[-4000:]}


def make_fixtures(folder: Path) -> subprocess.Popen[bytes]:
    """gpt2-folder now; the seed checkpoint runs/r in the background (returned)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=256, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder / "gpt2-folder")
    seed = ["run", "--model.module", "mymod:build", "--checkpoint.create-seed", "--run.name", "r"]
    log = (folder / "seed.log").open("wb")
    cli = "from disttrain.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", cli, *seed], cwd=folder, stdout=log, stderr=log)


def main(fixtures: Path, spec_path: Path, out_path: Path) -> int:
    os.chdir(fixtures)
    sys.path.insert(0, str(fixtures))
    spec = json.loads(spec_path.read_text())
    seed = make_fixtures(fixtures)
    results: dict[str, Any] = {}
    later = [c for c in spec if any(a.startswith("runs/") for a in c["argv"])]
    for c in [c for c in spec if c not in later]:
        results[c["key"]] = run_captured(c["argv"], c["mode"])
    if seed.wait(timeout=240) != 0:
        print((fixtures / "seed.log").read_text()[-3000:], file=sys.stderr)
        return 1
    (fixtures / "runs" / "seed").symlink_to("r")
    for c in later:
        results[c["key"]] = run_captured(c["argv"], c["mode"])
    out_path.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
