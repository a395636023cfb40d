"""The virtualenv that runs Hugging Face `transformers serve` for the real-server tests.

`transformers serve` needs torch, far too heavy for Tether's own environment, so it gets its
own virtualenv, built once and reused: `$TETHER_TEST_CACHE/transformers-venv` (default
`~/.cache/tether-tests`). torch is pinned to its CPU build (`+cpu`, the wheel CI machines
keep locally): a CUDA build is never installed. `TETHER_TEST_TRANSFORMERS_PYTHON` may point
at an interpreter that already has both.

CI builds it before pytest with `python3 tests/real_servers/transformers_venv.py` (prints the
interpreter's path; exits non-zero with the reason when it cannot be built). The tests fail,
never skip, when it cannot be had.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0+cpu"
TRANSFORMERS_VERSION = "5.24.0"
READY = f".tether-ready-{TORCH}-{TRANSFORMERS_VERSION}"


class TransformersVenvError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TETHER_TEST_CACHE") or Path.home() / ".cache" / "tether-tests")


def works(python: Path) -> bool:
    probe = (
        "import importlib.metadata as m, torch; "
        f"assert m.version('transformers') == '{TRANSFORMERS_VERSION}'; "
        "assert torch.version.cuda is None; "
        "import fastapi, uvicorn, tokenizers"
    )
    try:
        return (
            subprocess.run([str(python), "-c", probe], capture_output=True, timeout=120).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def build_transformers_venv() -> Path:
    """The interpreter of a virtualenv with CPU torch and transformers serve (built if
    needed)."""
    override = os.environ.get("TETHER_TEST_TRANSFORMERS_PYTHON")
    if override:
        if not works(Path(override)):
            raise TransformersVenvError(
                f"TETHER_TEST_TRANSFORMERS_PYTHON={override} lacks CPU torch or "
                f"transformers {TRANSFORMERS_VERSION}."
            )
        return Path(override)
    venv = cache_dir() / "transformers-venv"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "transformers-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel runs build it once
        if (venv / READY).exists() and works(python):
            return python
        log = venv.parent / "transformers-venv-build.log"
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            # torch first, alone and without dependencies resolved from elsewhere: the CPU
            # wheel, or nothing.
            [*pip, TORCH],
            [*pip, f"transformers[serving]=={TRANSFORMERS_VERSION}", TORCH],
        ]
        with open(log, "w") as out:
            for step in steps:
                result = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
                if result.returncode != 0:
                    raise TransformersVenvError(
                        f"Could not build the transformers virtualenv ({' '.join(step)} exited "
                        f"{result.returncode}); see {log}:\n"
                        + log.read_text(errors="replace")[-3000:]
                    )
        if not works(python):
            raise TransformersVenvError(
                f"The virtualenv {venv} was built but has no CPU torch or transformers "
                f"{TRANSFORMERS_VERSION}; see {log}."
            )
        (venv / READY).write_text("ok")
    return python


if __name__ == "__main__":
    try:
        print(build_transformers_venv())
    except TransformersVenvError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
