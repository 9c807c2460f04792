"""The docs' sample outputs are the commands' real output, and their lists of config sections are JobConfig's.

A sample is a fenced block under ``<!-- output of: COMMAND -->`` (scripts/refresh_doc_outputs.py says the rules):
its lines must appear in the real output in order, the same words, numbers free to differ. The quick start's
``make run`` trains for minutes, so its sample names a stand-in, ``disttrain run`` for 3 steps, whose last lines
have the same format (``; checked with: ...``); ``scripts/refresh_doc_outputs.py`` rewrites stale samples.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest

from conftest import ROOT, doc_outputs, is_quick_start

refresh = doc_outputs()
SAMPLES = refresh.every_sample()


@pytest.mark.timeout(30)
def test_a_sample_holds_up_to_numbers_and_fails_on_words() -> None:
    output = (
        "step 3/3 | loss 3.6297 | 2,078 tok/s\ndone: 3 steps in 9s | final val loss 3.5139\nrun folder: runs/2026-ddp\n"
    )
    assert (
        refresh.stale_lines(
            ["done: 300 steps in 173s | final val loss 2.2834", "...", "run folder: runs/1-ddp"], output
        )
        == []
    )
    assert refresh.stale_lines(["run folder: runs/1-ddp", "done: 3 steps in 9s | final val loss 1"], output) == [
        "done: 3 steps in 9s | final val loss 1"  # out of order
    ]
    assert refresh.stale_lines(["done: 3 steps in 9s | final loss 3.5"], output) == [
        "done: 3 steps in 9s | final loss 3.5"
    ]
    lines = ("done: 300 steps in 173s | final loss 2.28", "run folder: runs/1-ddp")
    assert refresh.refreshed(lines, output, keep_figures=True) == [
        "done: 3 steps in 9s | final val loss 3.5139",  # the words changed: the real line
        "run folder: runs/1-ddp",  # a stand-in's figures are not the page's: kept
    ]
    assert refresh.refreshed(lines, output, keep_figures=False)[1] == "run folder: runs/2026-ddp"


@pytest.mark.timeout(30)
def test_the_pages_have_their_samples() -> None:
    """The README's quick start and the planning page's recommendations are checked (a marker lost in an edit would
    silently check nothing)."""
    commands = {(s.page.name, s.command[0]) for s in SAMPLES}
    assert {("README.md", "run"), ("parallelism.md", "estimate")} <= commands, commands


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "sample",
    [
        pytest.param(s, marks=[pytest.mark.slow] if s.command[0] == "run" else [], id=s.id)
        for s in SAMPLES
        if not is_quick_start(s)  # tests/cli/test_jobs.py checks it against the make run it runs anyway
    ],
)
def test_a_sample_output_is_the_real_output(sample: Any) -> None:
    stale = refresh.stale_lines(sample.lines, refresh.real_output(sample))
    assert not stale, (
        f"{sample.id}: the sample output of `disttrain {shlex.join(sample.command)}` is out of date; "
        f"these lines are not in its real output (numbers aside): {stale}. "
        "Run `.venv/bin/python scripts/refresh_doc_outputs.py` to rewrite it from the real output."
    )


@pytest.mark.timeout(30)
def test_the_configuration_pages_list_of_sections_is_jobconfigs() -> None:
    from disttrain.config import section_types

    page = (ROOT / "docs" / "configuration.md").read_text()
    m = re.search(r"one dataclass per section \(([^)]*)\)", page)
    assert m is not None, "docs/configuration.md: the list 'one dataclass per section (`model`, ...)' is gone"
    listed = re.findall(r"`(\w+)`", m.group(1))
    assert listed == list(section_types()), (
        f"docs/configuration.md lists {listed}, JobConfig has {list(section_types())}"
    )
