"""Write a Hermes `state.db` with hermes-agent's own `SessionDB` (in its virtualenv), as its
CLI would: sessions, messages, in-place compaction, rotation. Tests describe the writes as
a list of operations; nothing here imitates the schema by hand."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from hermes_state import SessionDB

db = SessionDB(Path(sys.argv[1]))
for op, *args in json.loads(sys.stdin.read()):
    if op == "create":
        sid, source, kwargs = args
        db.create_session(sid, source, **kwargs)
    elif op == "append":
        sid, role, content, kwargs = args
        if isinstance(content, list):
            content = json.dumps(content)
        db.append_message(sid, role, content, **kwargs)
    elif op == "end":
        db.end_session(*args)
    elif op == "compact":
        db.archive_and_compact(*args)
    elif op == "replace":
        db.replace_messages(*args)
    elif op == "archive":
        db.set_session_archived(args[0], True)
    elif op == "sleep":
        time.sleep(args[0])
    else:
        raise SystemExit(f"unknown op {op}")
"""


def write_state(hermes_python: Path, home: Path, ops: list[list[Any]]) -> Path:
    """Apply `ops` to `<home>/state.db` and return its path."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "state.db"
    done = subprocess.run(
        [str(hermes_python), "-c", _SCRIPT, str(path)],
        input=json.dumps(ops),
        capture_output=True,
        text=True,
        timeout=120,
        env={"HERMES_HOME": str(home), "PATH": "/usr/bin:/bin", "HOME": str(home)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return path
