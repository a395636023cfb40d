"""What the benchmarks share: the test suite's helpers (the fake model, the server process),
percentiles, machine CPU counters and writing results. Scripts run as `python bench/X.py`,
so this directory is on `sys.path`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))  # fake_openai, helpers

from helpers import ServerProcess  # noqa: E402 - tests/ is on the path from here

MODEL = "fake-model"


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


def model_server(data_dir: Path, model_url: str, *extra: str) -> ServerProcess:
    """`tether serve` (not started) running the fake model at `model_url` as its OpenAI
    runtime, with the default heartbeat (the test helper's 0.3 s is for tests)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return ServerProcess(
        data_dir,
        "--runtime",
        "openai",
        "--base-url",
        model_url,
        "--model",
        MODEL,
        "--heartbeat-seconds",
        "5",
        *extra,
    )


def _stop(server: ServerProcess) -> None:
    if server.proc is not None and server.proc.poll() is None:
        server.stop()


@contextmanager
def replicas(
    root: Path, count: int, model_url: str, database_url: str, *extra: str
) -> Iterator[list[ServerProcess]]:
    """`count` started `model_server`s sharing the PostgreSQL database `database_url`,
    stopped on leaving the block."""
    with ExitStack() as stack:
        servers = []
        for n in range(count):
            server = model_server(root / f"r{n}", model_url, "--database-url", database_url, *extra)
            stack.callback(
                lambda s=server: s.proc is not None and s.proc.poll() is None and s.stop()
            )
            servers.append(server.start(timeout=120))  # a loaded machine starts slowly
        yield servers
