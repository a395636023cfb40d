"""Support for the Hermes tests: the hermes-agent virtualenv the sidecar runs with, and a
Hermes home pointed at the fake server.

hermes-agent pins its dependencies exactly, so it gets its own virtualenv, built once and
reused across runs: `$TETHER_TEST_CACHE/hermes-venv` (default `~/.cache/tether-tests`).
`TETHER_TEST_HERMES_PYTHON` may point at an interpreter that already has it.

CI builds it before pytest with `python3 tests/hermes/hermes_venv.py` (prints the
interpreter's path; exits non-zero with the reason when it cannot be built).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERMES_VERSION = "0.19.0"


class HermesVenvError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TETHER_TEST_CACHE") or Path.home() / ".cache" / "tether-tests")


def works(python: Path) -> bool:
    probe = (
        "import importlib.metadata as m, importlib.util as u; "
        f"assert m.version('hermes-agent') == '{HERMES_VERSION}'; "
        "assert u.find_spec('run_agent')"
    )
    try:
        return (
            subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def build_hermes_venv() -> Path:
    """The interpreter of a virtualenv with hermes-agent==HERMES_VERSION (built if needed)."""
    override = os.environ.get("TETHER_TEST_HERMES_PYTHON")
    if override:
        if not works(Path(override)):
            raise HermesVenvError(
                f"TETHER_TEST_HERMES_PYTHON={override} has no hermes-agent {HERMES_VERSION}."
            )
        return Path(override)
    venv = cache_dir() / "hermes-venv"
    python = venv / "bin" / "python"
    ready = venv / f".tether-ready-{HERMES_VERSION}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "hermes-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel runs build it once
        if ready.exists() and works(python):
            return python
        log = venv.parent / "hermes-venv-build.log"
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"hermes-agent=={HERMES_VERSION}",
            ],
        ]
        with open(log, "w") as out:
            for step in steps:
                result = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
                if result.returncode != 0:
                    raise HermesVenvError(
                        f"Could not build the hermes-agent virtualenv ({' '.join(step)} exited "
                        f"{result.returncode}); see {log}:\n"
                        + log.read_text(errors="replace")[-3000:]
                    )
        if not works(python):
            raise HermesVenvError(
                f"The virtualenv {venv} was built but cannot import "
                f"hermes-agent {HERMES_VERSION}; see {log}."
            )
        ready.write_text(HERMES_VERSION)
    return python


def write_home(home: Path, fake: Any, *, in_place: bool = True, compression: bool = False) -> Path:
    """A Hermes home for the tests: no host probing, one retry, the fake as every endpoint."""
    home.mkdir(parents=True, exist_ok=True)
    lines = [
        "agent:",
        "  environment_probe: false",
        "  api_max_retries: 1",
        "compression:",
        f"  enabled: {'true' if compression else 'false'}",
        f"  in_place: {'true' if in_place else 'false'}",
        "  threshold: 0.5",
        "  protect_first_n: 1",
        "  protect_last_n: 2",
        "auxiliary:",
        "  compression:",
        "    provider: custom",
        f"    base_url: {fake.base_url}",
        f"    model: {fake.model}",
        "    api_key: test-key",
        "model:",
        f"  default: {fake.model}",
        "  provider: custom",
        f"  base_url: {fake.base_url}",
        "  api_key: test-key",
        "memory:",
        "  memory_enabled: false",
        "  user_profile_enabled: false",
    ]
    (home / "config.yaml").write_text("\n".join(lines) + "\n")
    return home


if __name__ == "__main__":
    try:
        print(build_hermes_venv())
    except HermesVenvError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
