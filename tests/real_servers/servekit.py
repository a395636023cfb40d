"""`transformers serve` as a subprocess on a loopback port, offline (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from helpers import free_port

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def offline_env(home: Path) -> dict[str, str]:
    """The environment for the virtualenv's processes: offline, its own HF home, and not
    Tether's PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, **OFFLINE, "HF_HOME": str(home)}


class TransformersServe:
    """`transformers serve MODEL_DIR` on a loopback port, pinned to that model."""

    def __init__(self, python: Path, model_dir: Path, log: Path):
        self.python = python
        self.model = str(model_dir)
        self.port = free_port()
        self.log_path = log
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 180) -> TransformersServe:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        cli = Path(self.python).parent / "transformers"
        self.proc = subprocess.Popen(
            [str(cli), "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port)]
            + ["--device", "cpu", "--log-level", "info"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=offline_env(self.log_path.parent / "hf-home"),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"transformers serve did not become ready:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
