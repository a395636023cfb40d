"""What the benchmarks share: the test suite's helpers (the fake model, the server process),
percentiles, machine CPU counters and writing results. Scripts run as `python bench/X.py`,
so this directory is on `sys.path`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))  # fake_openai, helpers


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def machine_busy_ticks() -> int | None:
    """CPU ticks all cores spent on anything but idle and I/O wait (Linux; None elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
        values = [int(v) for v in fields]
    except (OSError, ValueError):
        return None
    return sum(values) - values[3] - values[4]


def write_results(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"results written to {path}")
