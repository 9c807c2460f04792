"""One command line for every command that runs a job of sections (``run``, ``estimate``, ``ps``, ``rl``).

``--config FILE`` (TOML), then ``--section.key value`` overrides (hyphens or underscores), ``--print-config``,
the command's own few flags, and ``--help`` generated from the dataclasses' field docstrings (tyro), the
command's flags listed above the sections. An unknown option is one line naming the closest known one.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from disttrain.config.io import load_toml, to_toml
from disttrain.config.overrides import apply_overrides, parse_dataclass

J = TypeVar("J")


@dataclasses.dataclass(frozen=True)
class Flag:
    """One of a command's own options, beside the job's ``--section.key`` ones."""

    name: str
    """The option, e.g. '--json'."""
    help: str
    """What it does, for ``--help``."""
    metavar: str | None = None
    """It takes a value, shown as this in ``--help`` (None: a switch)."""
    key: str | None = None
    """A short name for this job key ('launch.max_restarts'): its value is applied as that override."""
    short: str | None = None
    """A one-letter form ('-n')."""

    @property
    def dest(self) -> str:
        """Its name in :attr:`CommandLine.flags` ('--inter-node-bandwidth' -> 'inter_node_bandwidth')."""
        return self.name[2:].replace("-", "_")


COMMON_FLAGS = (
    Flag("--config", "read the job from a TOML file ([section] key = value); the options below override it", "FILE"),
    Flag("--print-config", "print the resolved config (TOML, what the run folder's config.toml holds) and exit"),
)


@dataclasses.dataclass
class CommandLine(Generic[J]):
    """A parsed command line: the job's config, and the command's own flags."""

    cfg: J
    """The job: its defaults, then the TOML file, then the overrides."""
    print_config: bool
    """``--print-config`` was given."""
    flags: dict[str, Any]
    """The command's own flags by :attr:`Flag.dest`: True/False for a switch, the value or None otherwise."""


def parse_command(
    job: type[J], argv: list[str], prog: str, summary: str, flags: Sequence[Flag] = ()
) -> CommandLine[J] | None:
    """``argv`` of ``prog`` as a ``job`` config (a dataclass of sections) and the command's ``flags``; None when
    ``--help`` was asked for (the help is printed: ``summary``, the flags, then every section's options)."""
    every = (*COMMON_FLAGS, *flags)
    parser = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    for f in every:
        names = [f.short, f.name] if f.short else [f.name]
        if f.metavar is None:
            parser.add_argument(*names, dest=f.dest, action="store_true")
        else:
            parser.add_argument(*names, dest=f.dest, default=None)
    known, rest = parser.parse_known_args(argv)
    values = vars(known)
    for f in every:
        if f.key is not None and values[f.dest] is not None:
            rest += [f"--{f.key}", str(values[f.dest])]
    base = load_toml(values["config"], job=job) if values["config"] else job()
    if any(a in ("-h", "--help") for a in rest):  # the defaults it shows are the TOML file's, if one was given
        try:
            parse_dataclass(job, ["--help"], prog, default=base, description=describe(summary, every))
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        return None
    cfg = apply_overrides(base, rest, prog, [f.name for f in every])
    own = {f.dest: values[f.dest] for f in flags if f.key is None}
    return CommandLine(cfg, bool(values["print_config"]), own)


def parse_job(
    job: type[J], argv: list[str], prog: str, summary: str, flags: Sequence[Flag] = ()
) -> CommandLine[J] | None:
    """:func:`parse_command` for a command whose config needs no resolving to be shown: None when the line
    was answered here (``--help`` printed, or ``--print-config``'s TOML)."""
    line = parse_command(job, argv, prog, summary, flags)
    if line is not None and line.print_config:
        print(to_toml(line.cfg), end="")
        return None
    return line


def describe(summary: str, flags: Sequence[Flag]) -> str:
    """The text above the sections in ``--help``: what the command does, then its own flags, one per line."""
    width = 24
    # indented: tyro joins a line that starts with a letter to the one before it
    lines = [textwrap.fill(summary, 100, initial_indent="  ", subsequent_indent="  ")]
    lines += ["", "command options:"]
    for f in flags:
        name = f"{f.short}, {f.name}" if f.short else f.name
        head = f"  {name} {f.metavar}" if f.metavar else f"  {name}"
        text = f.help + (f" (= --{f.key.replace('_', '-')})" if f.key else "")
        body = textwrap.wrap(text, 100 - width)
        first = f"{head:<{width}}{body[0]}" if len(head) < width else f"{head}\n{' ' * width}{body[0]}"
        lines += [first, *(" " * width + b for b in body[1:])]
    return "\n".join(lines) + "\n"
