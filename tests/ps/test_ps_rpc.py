"""The parameter server over real RPC processes: 2 servers and a trainer (tests/ps_scenarios.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TESTS, disttrain


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_table_sharded_over_two_servers_equals_the_whole_table(tmp_path: Path) -> None:
    proc = disttrain("launch", "-n", "3", str(TESTS / "ps_scenarios.py"), str(tmp_path), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "ps.json").read_text())
    for scheme in ("mod", "range"):
        assert result[scheme]["pulls_equal"] and result[scheme]["tables_equal"], result[scheme]
    errors = result["errors"]
    assert errors["missing_table"].startswith("rpc: pull on server0 failed:"), errors
    assert "no table 'nope' on this server" in errors["missing_table"]
    assert errors["timeout"].startswith("rpc: sleep on server1 failed: timed out"), errors
    combined = result["combined"]  # 8 pushes in flight at once
    assert combined["equal"] and combined["stats"]["pushes"] == 8, combined
    assert combined["stats"]["updates"] < 8 and max(combined["held"]) > 1, combined  # some applied together
