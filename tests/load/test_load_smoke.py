"""Smoke run of the load test (`bench/load_test.py --quick`): 10 concurrent runs and 40 SSE
subscribers for 10 s against a real `tether serve` and the fake model.

What must hold: no subscriber lost or received twice any event (the script itself exits with
status 1 if one did, and the JSON says so), every turn completed, and ordinary requests did not
stall behind the streams. The full test's target for the two GETs is p99 < 100 ms with 50
runs and 200 subscribers on 2 dedicated cores; here the bound is a generous 250 ms because the
client, the fake model, the server and whatever else CI runs share those cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "load_test.py"
GET_P99_BOUND_MS = 250.0


@pytest.mark.timeout(90)
def test_quick_load_loses_nothing_and_keeps_gets_fast(tmp_path: Path) -> None:
    out = tmp_path / "load_test.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--seconds",
            "10",
            "--runs",
            "10",
            "--subscribers",
            "40",
            "--dir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=80,
    )
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    results = json.loads(out.read_text())

    delivery = results["delivery"]
    assert delivery["subscribers"] == 40, report
    assert delivery["lost"] == 0 and delivery["duplicated"] == 0, report
    assert delivery["out_of_order"] == 0 and delivery["ok"], report

    turns = results["results"]["turns"]
    assert turns["started"] >= 10, report  # at least one turn per session
    assert turns["completed"] == turns["started"], report
    assert results["results"]["throughput"]["delivered_events"] > 0, report

    for path in ("/api/sessions", "/api/session"):
        probe = results["results"]["probes"][f"load {path}"]
        assert probe["n"] > 0 and probe["errors"] == 0, report
        assert probe["p99_ms"] < GET_P99_BOUND_MS, (
            f"GET {path} p99 {probe['p99_ms']:.0f} ms\n" + report
        )
