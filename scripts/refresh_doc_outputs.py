"""The sample outputs in README.md and docs/*.md, checked against (and rewritten from) the commands' real output.

A sample is a fenced block right under a marker naming the command whose output it shows:

    <!-- output of: disttrain estimate --parallel.nproc 8 -->
    ```
    recommended: ddp — DDP needs 354.62 MiB per rank ...
    ```

When the command the page shows is too slow for the suite (``make run`` trains for minutes), the marker names a
quicker one with the same output format: ``<!-- output of: make run; checked with: disttrain run --train.steps 3
-->``. A sample is an excerpt: its lines appear in the real output in the same order, the same words, with any
numbers (timings, sizes, paths with dates); a line ``...`` stands for lines left out. tests/docs/test_doc_outputs.py
fails when one does not; this script runs every marked command and rewrites each stale sample from the real
output, line by line (the closest real line where the words changed; with a stand-in command, the lines that still
match keep the page's figures):

    .venv/bin/python scripts/refresh_doc_outputs.py            # rewrite the stale samples
    .venv/bin/python scripts/refresh_doc_outputs.py --check    # only say which are stale (exit 1)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- output of: (?P<shown>.+?)(?:; checked with: (?P<checked>.+?))? -->$")
ELIDED = "..."
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One marked block: where it is, the command that makes its output, its lines."""

    page: Path
    line: int
    """The marker's line number (1-based)."""
    command: tuple[str, ...]
    """What follows ``disttrain``."""
    lines: tuple[str, ...]
    stand_in: bool
    """The command checked is a quicker one than the page shows (``; checked with:``)."""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def samples(page: Path) -> list[Sample]:
    """Every marked block of ``page``; a marker without a fenced block right under it is an error."""
    text = page.read_text().splitlines()
    found = []
    for i, line in enumerate(text):
        m = MARK.match(line.strip())
        if m is None:
            continue
        where = f"{page.relative_to(ROOT)}:{i + 1}"
        if i + 1 >= len(text) or not text[i + 1].startswith("```"):
            raise ValueError(f"{where}: an output marker needs a fenced block on the next line")
        end = next((j for j in range(i + 2, len(text)) if text[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{where}: the block under the marker is not closed")
        argv = shlex.split(m.group("checked") or m.group("shown"))
        if argv[:1] != ["disttrain"]:
            raise ValueError(f"{where}: the command checked must be a disttrain command (add '; checked with: ...')")
        found.append(Sample(page, i + 1, tuple(argv[1:]), tuple(text[i + 2 : end]), bool(m.group("checked"))))
    return found


def every_sample() -> list[Sample]:
    return [s for page in PAGES for s in samples(page)]


def normalized(line: str) -> str:
    """A line as the check compares it: whitespace collapsed, every number as '#'."""
    return _NUMBER.sub("#", " ".join(line.split()))


def stale_lines(lines: tuple[str, ...] | list[str], output: str) -> list[str]:
    """The sample's lines that are not in ``output`` (in order, up to numbers); [] when the sample holds."""
    real = [normalized(x) for x in output.splitlines()]
    at, stale = 0, []
    for line in lines:
        if line.strip() == ELIDED:
            continue
        want = normalized(line)
        hit = next((i for i in range(at, len(real)) if real[i] == want), None)
        if hit is None:
            stale.append(line)
        else:
            at = hit + 1
    return stale


def refreshed(lines: tuple[str, ...], output: str, keep_figures: bool) -> list[str]:
    """The sample from ``output``: each line as the real line it matches (or, when none does, the closest real line
    after the previous one); ``keep_figures``: a line that matches keeps its own numbers (a stand-in command's
    figures are not the page's)."""
    real = [x.rstrip() for x in output.splitlines()]
    keys = [normalized(x) for x in real]
    at, out = 0, []
    for line in lines:
        if line.strip() == ELIDED or at >= len(real):
            out.append(line)
            continue
        want = normalized(line)
        hit = next((i for i in range(at, len(real)) if keys[i] == want), None)
        if hit is None:
            ratios = [difflib.SequenceMatcher(None, want, k).ratio() for k in keys[at:]]
            hit = at + max(range(len(ratios)), key=ratios.__getitem__)
        out.append(line if keys[hit] == want and keep_figures else real[hit])
        at = hit + 1
    return out


def env(cache: Path) -> dict[str, str]:
    """The command's environment: this checkout's src first, one thread per process, a machine cache of its own
    (no `disttrain doctor` measurements of this machine change the plan)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), e.get("PYTHONPATH", "")) if p)
    e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DISTTRAIN_CACHE_DIR=str(cache))
    return e


def real_output(sample: Sample, timeout: float = 300) -> str:
    """The command's stdout and stderr together, run in an empty folder (its run folders go there)."""
    exe = Path(sys.executable).with_name("disttrain")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [str(exe), *sample.command],
            cwd=tmp,
            env=env(Path(tmp) / "cache"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{sample.id}: `disttrain {shlex.join(sample.command)}` exited {proc.returncode}:\n{proc.stdout[-3000:]}"
        )
    return proc.stdout


def rewrite(sample: Sample, new: list[str]) -> None:
    text = sample.page.read_text().splitlines(keepends=True)
    body = slice(sample.line + 1, sample.line + 1 + len(sample.lines))
    text[body] = [x + "\n" for x in new]
    sample.page.write_text("".join(text))


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = 0
    for page in PAGES:
        for sample in reversed(samples(page)):  # from the bottom: a rewrite keeps the line numbers above it
            output = real_output(sample)
            if not stale_lines(sample.lines, output):
                continue
            stale += 1
            new = refreshed(sample.lines, output, keep_figures=sample.stand_in)
            print(f"{sample.id}: `disttrain {shlex.join(sample.command)}`: {'stale' if check else 'rewritten'}")
            sys.stdout.writelines(f"  - {a}\n  + {b}\n" for a, b in zip(sample.lines, new, strict=True) if a != b)
            if not check:
                rewrite(sample, new)
    print(f"{stale} stale sample(s)" + ("" if check or not stale else "; check the rewritten lines read well"))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
