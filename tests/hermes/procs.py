"""The processes a Hermes test started, found by a token in their command line (Hermes runs
a tool's command in a session of its own, so it is no child of anything the test holds)."""

from __future__ import annotations

from pathlib import Path


def processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
