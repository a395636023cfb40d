"""The import worker: a file is parsed, checked and turned into plans in a child process, so
none of it runs on the event loop (docs/api.md §12).

Why a process and not a thread: `json.loads` of a large export holds the GIL for as long as
it parses (a third of a second for a 30 MB file), and so does most of the checking; a thread
would stall every other request for that long. The child is started with `spawn` (the server
has threads; `fork` would copy their locks), at the lowest CPU priority, gets the file
through a pipe in the chunks the request brought (`send_file`: the server never joins
them) and sends back progress and the plans in chunks, so the server never unpickles one
large message either. It exits when the import is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from tether.sessions.transfer import chatgpt, tether_json
from tether.sessions.transfer.plan import (
    MAX_SESSIONS,
    Refusal,
    SessionPlan,
    check_depth,
    too_deep,
)

CHUNK = 5  # plans per message: each is unpickled in a few ms, the GIL held meanwhile


def _load(raw: bytes) -> Any:
    if raw.startswith(b"PK\x03\x04"):  # ChatGPT's data export arrives as one
        raise Refusal(
            "import_not_json",
            "The file is a zip archive: import the conversations.json inside it (ChatGPT's "
            "data export), or a file Tether exported.",
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Refusal(
            "import_not_json", f"The file is not UTF-8 text (byte {exc.start:,})."
        ) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise too_deep() from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):
            return _json_lines(text)
        if text.lstrip()[:1] == "<":  # such as the chat.html beside conversations.json
            raise Refusal(
                "import_not_json",
                "The file is an HTML page, not JSON: import conversations.json (ChatGPT's "
                "data export), or a file Tether exported.",
            ) from None
        raise Refusal(
            "import_not_json",
            f"The file is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.",
        ) from None


def _json_lines(text: str) -> list[Any]:
    """Tether's all-sessions file: one session per line. Lines end at `\n` only (a `\r`
    before it is JSON whitespace): `splitlines` would also cut at U+2028, U+0085 and the
    like, which the export writes unescaped inside a message's text."""
    out = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except RecursionError:
            raise too_deep() from None
        except json.JSONDecodeError as exc:
            raise Refusal(
                "import_not_json",
                f"Line {number} of the file is not JSON: {exc.msg} at column {exc.colno}.",
                line=number,
            ) from None
    return out


def plan_file(raw: bytes, progress: Callable[[int, int], None]) -> list[SessionPlan]:
    """Every session of the file as a plan, or a `Refusal` naming what is wrong."""
    value = _load(raw)
    check_depth(value)
    lines = isinstance(value, list) and bool(value) and all(map(tether_json.looks_like, value))
    if tether_json.looks_like(value) or lines:
        entries = value if lines else [value]
        _at_most(len(entries))
        progress(0, len(entries))

        def where(i: int) -> str:
            return f"line {i + 1}" if lines else ""

        return tether_json.plan_sessions(entries, lambda n: progress(n, len(entries)), where)
    if isinstance(value, list) and chatgpt.looks_like(value):
        _at_most(len(value))
        progress(0, len(value))
        return chatgpt.plan_sessions(value, lambda n: progress(n, len(value)))
    raise Refusal(
        "import_unknown_format",
        "This is neither a Tether export (one session, or the all-sessions file) nor "
        "ChatGPT's conversations.json.",
    )


def _at_most(count: int) -> None:
    if count > MAX_SESSIONS:
        raise Refusal(
            "import_too_large",
            f"The file holds {count:,} sessions; one import takes at most {MAX_SESSIONS:,}.",
            limit_sessions=MAX_SESSIONS,
        )
    if count == 0:
        raise Refusal("import_invalid", "The file holds no session.", path="")


def send_file(conn: Connection, chunks: list[bytes]) -> None:
    """The server's side of `child_main`'s first step: the file's chunks, then an empty one."""
    for chunk in chunks:
        if chunk:
            conn.send_bytes(chunk)
    conn.send_bytes(b"")


def child_main(conn: Connection) -> None:
    """The child process: read the file, send `("progress", done, total)` now and then, then
    `("plans", [...])` chunks and `("done",)`, or `("refused", code, message, extra)`."""
    os.nice(19)
    try:
        raw = b"".join(iter(conn.recv_bytes, b""))
        last = [-1]

        def progress(done: int, total: int) -> None:
            if done in (0, total) or done - last[0] >= max(1, total // 50):
                last[0] = done
                conn.send(("progress", done, total))

        plans = plan_file(raw, progress)
        del raw
        for start in range(0, len(plans), CHUNK):
            conn.send(("plans", plans[start : start + CHUNK]))
        conn.send(("done",))
    except Refusal as refusal:
        conn.send(("refused", refusal.code, refusal.message, refusal.extra))
    except Exception:
        conn.send(("failed", traceback.format_exc()))
    finally:
        conn.close()


def lowest_priority(pid: int | None) -> None:
    """What the server calls as soon as the child exists: `child_main` sets nice 19 too,
    but only once the child's interpreter has started and imported the server's modules,
    a few hundred ms of CPU at the server's own priority."""
    if pid is not None:
        with contextlib.suppress(OSError):  # it may be gone already
            os.setpriority(os.PRIO_PROCESS, pid, 19)
