"""Dotted command-line overrides (``--train.steps 500``) on top of a job config of sections (JobConfig, or the
parameter server's or RL's): tyro does the typing and the help text (from the field docstrings); a mistake
becomes one :class:`ConfigError` line, not tyro's box."""

from __future__ import annotations

import contextlib
import difflib
import io
import re
from collections.abc import Sequence
from typing import TypeVar, cast

from disttrain.config.job import JobConfig, known_keys
from disttrain.errors import ConfigError

T = TypeVar("T")

_RULE = re.compile(r"[-─━]{3,}")  # tyro's horizontal rules: '-----' without a terminal, box lines with one
_BOX = " \t│╭╮╰╯┃┏┓┗┛"
_PYTHON_PHRASES = (  # int('ten') / float('x') in tyro's messages, in the words the TOML checks use
    (re.compile(r"invalid literal for int\(\) with base 10: (.+)"), r"expected an integer, got \1"),
    (re.compile(r"could not convert string to float: (.+)"), r"expected a number, got \1"),
)
_UNION = re.compile(r"(\S+): no type matching (\S+) could be instantiated from \[(.*?)\]\.")  # X | None


def _flag_key(token: str) -> str | None:
    """'--train.global-batch=4' -> 'train.global_batch'; None for tokens that are not dotted options."""
    if not token.startswith("--") or "." not in token:
        return None
    key = token[2:].split("=", 1)[0].replace("-", "_")
    sec, _, name = key.partition(".")
    return f"{sec}.{name}"


def check_override_keys(
    argv: list[str], job: type = JobConfig, prog: str = "disttrain run", flags: Sequence[str] = ()
) -> None:
    """Reject unknown options up front (``job``'s ``--section.key`` ones are known, and the command's own
    ``flags`` were taken out before): one line naming the closest known option."""
    keys = set(known_keys(job))
    for tok in argv:
        if not tok.startswith("--") or tok == "--help":
            continue
        key = _flag_key(tok)
        if key is not None:
            sec, _, name = key.partition(".")
            if key in keys or (name.startswith("no_") and f"{sec}.{name[3:]}" in keys):
                continue
        raise ConfigError(unknown_option(tok.split("=", 1)[0], sorted(keys), flags, prog))


def unknown_option(flag: str, keys: list[str], flags: Sequence[str], prog: str) -> str:
    """'unknown option --ps.sever; did you mean --ps.servers?': the closest of the job's keys and the command's
    flags; a bare '--servers' finds the key it is the field of ('--ps.servers')."""
    options = {f"--{k.replace('_', '-')}": k for k in keys} | {f: f[2:].replace("-", "_") for f in flags}
    wanted = flag[2:].replace("-", "_")
    close = [o for o, k in options.items() if "." not in wanted and k.rpartition(".")[2] == wanted]
    if not close:
        by_key = difflib.get_close_matches(wanted, list(options.values()), n=1, cutoff=0.5)
        fields = {k.rpartition(".")[2]: k for k in keys}
        by_field = difflib.get_close_matches(wanted, list(fields), n=1, cutoff=0.6) if "." not in wanted else []
        match = by_key or [fields[f] for f in by_field]
        close = [o for o, k in options.items() if k in match]
    if not close:
        return f"unknown option {flag}; see `{prog} --help` (options look like --section.key, e.g. --train.steps 5)"
    return f"unknown option {flag}; did you mean {' or '.join(close)}?"


def _tyro_blocks(captured: str) -> list[list[str]]:
    """tyro's error box as its blocks of text lines, split at its rules (a rule's own text, the box title,
    is a block of its own)."""
    blocks: list[list[str]] = [[]]
    for raw in captured.splitlines():
        text = _RULE.sub(" ", raw).strip(_BOX).strip()
        if _RULE.search(raw):
            blocks += [[text], []] if text else [[]]
        elif text:
            blocks[-1].append(text)
    return [b for b in blocks if b]


def tyro_message(captured: str, prog: str = "disttrain run") -> str:
    """tyro's boxed error message as one clean line: the error, then the option's help when tyro gave it
    ('--train.steps: expected an integer, got 'ten'; help: --train.steps INT  Optimizer steps. (default: 300)')."""
    blocks = [b for b in _tyro_blocks(captured) if not b[0].startswith(("For full helptext", "usage:"))]
    if len(blocks) > 1:
        blocks = blocks[1:]  # the title ('Value error', 'Invalid choice') says less than the message
    message, help_text = "", ""
    for block in blocks:
        if block[0].rstrip(":") == "Argument helptext":
            help_text = "  ".join([block[1], " ".join(block[2:])]).strip() if len(block) > 1 else ""
        elif not message:
            message = _clean(" ".join(block))
    if not message:
        return f"invalid command-line options; see `{prog} --help`"
    return f"{message}; help: {help_text}" if help_text else message


def _clean(message: str) -> str:
    """tyro's message without its prefixes and Python's int()/float() wording."""
    message = re.sub(r"^Error parsing ", "", message)
    message = re.sub(r"^(\w+): (?=\1\.)", "", message)  # 'train: train.steps must be ...'
    message = re.sub(r"^[A-Z]\w*Config: ", "", message)  # 'PSJobConfig: ...' (a check across sections)
    if union := _UNION.match(message):  # '{None}|INT could be instantiated from ['x']. Got errors: ...'
        kinds = sorted((k.strip("{}") for k in union.group(2).split("|")), key=lambda k: k == "None")
        return f"{union.group(1)}: expected {' or '.join(kinds)}, got {union.group(3)}"
    for pattern, words in _PYTHON_PHRASES:
        message = pattern.sub(words, message)
    return message


def apply_overrides(base: T, argv: list[str], prog: str = "disttrain run", flags: Sequence[str] = ()) -> T:
    """Apply ``--section.key value`` overrides to ``base``, a job config of sections (tyro does the typing and
    the help text); ``flags``: the command's own options, for the hint when an option is unknown."""
    check_override_keys(argv, type(base), prog, flags)
    return parse_dataclass(type(base), argv, prog, default=base)


def parse_dataclass(
    cls: type[T], argv: list[str], prog: str, default: T | None = None, description: str | None = None
) -> T:
    """``cls`` from command-line options (tyro), its mistakes as one :class:`ConfigError` line; ``--help`` prints
    tyro's help (``description`` above the options) and exits."""
    import tyro

    if any(a in ("-h", "--help") for a in argv):
        from disttrain.config.helptext import help_view

        view, shown = help_view(cls, cls() if default is None else default)
        tyro.cli(view, default=shown, args=argv, prog=prog, description=description)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            return cast(T, tyro.cli(cls, default=default, args=argv, prog=prog))
    except SystemExit as e:
        if e.code in (0, None):
            raise
        raise ConfigError(tyro_message(err.getvalue(), prog)) from None
    except ConfigError:
        raise
    except ValueError as e:  # a __post_init__ check, raised while tyro builds the dataclass
        raise ConfigError(str(e)) from None
