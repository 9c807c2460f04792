"""Tables read from pytest's JUnit XML files: where the suite's time goes, and how often each test passed.

    python scripts/test_tables.py files RESULTS.xml [--top N]   # seconds per test file, slowest first
    python scripts/test_tables.py rounds DIR K                  # passes out of K per test (scripts/under-load.sh)

``files`` is what ``make test`` prints at its end (so a slower suite shows which file grew); ``rounds`` reads
DIR/round*.xml and exits 1 when a test passed fewer than K times (a test missing from a round counts as failed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def cases(xml: Path) -> list[tuple[str, str, float, str]]:
    """(test file, test id, seconds, outcome: passed, failed, error or skipped) of every test case in ``xml``."""
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        parts = cls.split(".")
        # classname is the module path, then a class when there is one: tests.health.test_health[.Class]
        mods = [p for p in parts if p.startswith("test_")]
        path = "/".join(parts[: parts.index(mods[0]) + 1]) + ".py" if mods else cls
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = "failed" if tag == "failure" else tag
                break
        out.append((path, f"{path}::{name}", float(case.get("time", 0.0)), outcome))
    return out


def files_table(xml: Path, top: int) -> str:
    """Seconds per test file (and tests in it), slowest first, with the total."""
    per_file: dict[str, list[float]] = defaultdict(list)
    for path, _, seconds, _ in cases(xml):
        per_file[path].append(seconds)
    rows = sorted(per_file.items(), key=lambda kv: -sum(kv[1]))
    total = sum(sum(v) for v in per_file.values())
    lines = [f"{'seconds':>8} {'share':>6} {'tests':>5}  file (the {min(top, len(rows))} slowest of {len(rows)})"]
    for path, times in rows[:top]:
        lines.append(f"{sum(times):8.1f} {sum(times) / max(total, 1e-9):6.1%} {len(times):5d}  {path}")
    lines.append(f"{total:8.1f} {1:6.0%} {sum(len(v) for v in per_file.values()):5d}  all files")
    return "\n".join(lines)


def rounds_table(folder: Path, count: int) -> tuple[str, bool]:
    """Per test: passes out of ``count`` rounds, median and slowest seconds; whether every test passed each."""
    seen: dict[str, list[tuple[float, str]]] = defaultdict(list)
    found = sorted(folder.glob("round*.xml"))
    for xml in found:
        for _, test, seconds, outcome in cases(xml):
            seen[test].append((seconds, outcome))
    lines = [f"{'passed':>8} {'median s':>9} {'max s':>7}  test ({len(found)} of {count} rounds wrote results)"]
    ok = len(found) == count and bool(seen)
    for test, runs in sorted(seen.items()):
        if all(o == "skipped" for _, o in runs):
            lines.append(f"{'skipped':>8} {'':>9} {'':>7}  {test}")
            continue
        passed = sum(o == "passed" for _, o in runs)
        ok = ok and passed == count
        times = [s for s, _ in runs]
        mark = (
            ""
            if passed == count
            else "   <-- " + ", ".join(sorted({o for _, o in runs if o != "passed"}) or ["missing"])
        )
        lines.append(f"{passed:>3}/{count:<4} {statistics.median(times):9.1f} {max(times):7.1f}  {test}{mark}")
    lines.append("every test passed every round" if ok else "NOT every test passed every round")
    return "\n".join(lines), ok


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    f = sub.add_parser("files", help="seconds per test file")
    f.add_argument("xml", type=Path)
    f.add_argument("--top", type=int, default=20)
    r = sub.add_parser("rounds", help="passes out of K per test")
    r.add_argument("folder", type=Path)
    r.add_argument("count", type=int)
    a = p.parse_args(argv)
    if a.what == "files":
        if not a.xml.is_file():
            print(f"test_tables: no {a.xml} (did pytest run?)", file=sys.stderr)
            return 2
        print(files_table(a.xml, a.top))
        return 0
    table, ok = rounds_table(a.folder, a.count)
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
