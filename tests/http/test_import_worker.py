"""The import's child process (`sessions/transfer/worker.py`) stays out of the server's way."""

from __future__ import annotations

import os
import subprocess
import sys

from tether.sessions.transfer.worker import lowest_priority


def test_the_child_gets_the_lowest_cpu_priority_from_the_server_at_once() -> None:
    """The child lowers its own priority only once its interpreter has started and imported
    the server's modules, a few hundred ms of CPU at the server's priority; the server sets
    it as soon as the child exists."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        lowest_priority(child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 19
    finally:
        child.kill()
        child.wait()
    lowest_priority(child.pid)  # a child already gone is no error
    lowest_priority(None)  # nor one that never started
