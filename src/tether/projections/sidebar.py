"""The sidebar `Row` (docs/api.md §3) as a pure fold, persisted beside the log by the writer.

Contract invariant 4: only meaningful user or assistant activity (a submitted turn, a run
that finished by its own or the user's doing) moves `updated_at` / `last_message_at`.
Renames, pins, archiving, recovery (`interrupted`) and any other maintenance never do.

Nor do they raise `activity_count`, the count the page's unread stores compare: a run that
recovery or shutdown settled still adds its visible row to `message_count` (its partial output
stays readable), but marking the session unread for it would present maintenance as news.

The fold also keeps the run the log shows unfinished (`open_stream`: its `turn.submitted`
without its `run.finished`) and whether a Stop was recorded for it: on a log several replicas
share, that is how a replica knows of a run another one runs (sessions/service.py,
`SessionService.occupancy`).
"""

from __future__ import annotations

from typing import Any

from tether import events as ev
from tether.events import Event
from tether.visible_text import shows_something, visible_line

# Bump when the fold changes: the store then rebuilds every persisted row from the log.
# sidebar-11: titles are folded as visible text (a log written before titles were cleaned
# shows them cleaned once its rows are rebuilt).
SIDEBAR_FOLD_VERSION = "sidebar-11"

DEFAULT_TITLE = "New chat"
TITLE_MAX = 80

# The event types that can change a row: the sidebar feed ignores the rest (deltas, tools).
ROW_EVENT_TYPES = frozenset(
    {
        ev.SESSION_CREATED,
        ev.SESSION_UPDATED,
        ev.TURN_SUBMITTED,
        ev.RUN_FINISHED,
        ev.RUN_CANCEL_REQUESTED,
        ev.TRANSCRIPT_TRUNCATED,
        ev.BRANCH_SWITCHED,
        ev.SESSION_ROTATED,
        ev.AGENT_IMPORTED,
    }
)

# Terminal states that are not the user's or the assistant's doing.
_MAINTENANCE_STATES = {"interrupted"}


def title_from_message(text: str) -> str:
    """The first line of `text` that shows something, as visible text (`visible_line`), cut
    to TITLE_MAX characters; "" when no line does."""
    lines = (visible_line(line) for line in text.splitlines())
    first = next((line for line in lines if shows_something(line)), "")
    return first if len(first) <= TITLE_MAX else first[: TITLE_MAX - 1].rstrip() + "…"


def given_title(title: Any) -> str | None:
    """A title an event names (created, renamed, imported) as it is shown: the API cleans a
    title before writing it, but a log written before it did, or another replica's, may hold
    bidi or zero-width characters; None (the first message names the session) when nothing
    visible is left."""
    if not isinstance(title, str):
        return None
    title = visible_line(title)
    return title if shows_something(title) else None


def title_from_turn(data: dict[str, Any]) -> str | None:
    """What a submitted message names its session: its first line, or, a message of
    attachments only, its first attachment's name; None when it has neither."""
    title = title_from_message(data.get("text", ""))
    if not title:
        names = (title_from_message(a.get("name", "")) for a in data.get("attachments") or [])
        title = next((name for name in names if name), "")
    return title or None


def fold_row(state: dict[str, Any] | None, event: Event) -> dict[str, Any]:
    """Return the row state after `event`; never mutates `state`. Events at or below the
    state's `last_seq` are ignored, so folding the same events twice equals folding once."""
    if state is None:
        state = {
            "session_id": event.session_id,
            "title": None,
            "title_from_message": None,
            "created_at": event.at,
            "pinned": False,
            "archived": False,
            "updated_at": event.at,
            "last_message_at": None,
            "message_count": 0,
            "maintenance_rows": 0,
            "transcript_generation": 0,
            "transcript_generation_baseline": 0,
            "parent_session_id": None,
            "continuation_session_id": None,
            "last_run_state": None,
            "model": None,
            "system_prompt": None,
            "open_stream": None,
            "stop_requested": False,
            "last_seq": 0,
        }
    if event.seq <= state["last_seq"]:
        return state
    row = dict(state)
    row["last_seq"] = event.seq
    data = event.data
    if event.type == ev.SESSION_CREATED:
        row["title"] = given_title(data.get("title"))
        row["parent_session_id"] = data.get("parent_session_id")
        # What an import made this session from (docs/api.md §12): the same file imported
        # again finds it here. Rows folded before imports existed have no key, as none was
        # imported, so the fold's version stays.
        imported = data.get("imported")
        if isinstance(imported, dict) and isinstance(imported.get("key"), str):
            row["import_key"] = imported["key"]
        # A rotated continuation takes its parent's place without looking newer (inv. 4).
        if data.get("inherited_updated_at") is not None:
            row["updated_at"] = data["inherited_updated_at"]
            row["last_message_at"] = data.get("inherited_last_message_at")
    elif event.type == ev.SESSION_UPDATED:
        for key in ("pinned", "archived", "model", "system_prompt"):
            if key in data:
                row[key] = data[key]
        if "title" in data:
            row["title"] = given_title(data["title"])
    elif event.type == ev.TURN_SUBMITTED:
        if event.stream_id is not None and event.stream_id != row.get("open_stream"):
            row["open_stream"], row["stop_requested"] = event.stream_id, False
        row["updated_at"] = row["last_message_at"] = event.at
        if data.get("regenerate"):  # a new answer to a turn already shown: no new row yet
            return row
        if row["message_count"] == 0:
            # The first message shown names the session, an edit of it too; each first
            # message is kept by its row id, for a switch back to its branch.
            title = title_from_turn(data)
            row["title_from_message"] = title
            row["root_titles"] = {**row.get("root_titles", {}), data.get("turn_id"): title}
        elif row["title_from_message"] is None:
            row["title_from_message"] = title_from_turn(data)
        row["message_count"] += 1
    elif event.type == ev.RUN_FINISHED:
        if event.stream_id == row.get("open_stream"):
            row["open_stream"], row["stop_requested"] = None, False
        row["message_count"] += 1
        if not data.get("maintenance"):
            row["last_run_state"] = data.get("state", "completed")  # shown, never sorted on
        elif event.stream_id is not None:  # rare (a restart, a shutdown): a branch skips it
            row["maintenance_runs"] = [*row.get("maintenance_runs", []), event.stream_id]
        if data.get("state") not in _MAINTENANCE_STATES and not data.get("maintenance"):
            row["updated_at"] = row["last_message_at"] = event.at
        else:
            row["maintenance_rows"] += 1
    elif event.type == ev.RUN_CANCEL_REQUESTED:
        if event.stream_id == row.get("open_stream"):
            row["stop_requested"] = True
    elif event.type == ev.TRANSCRIPT_TRUNCATED:
        row["message_count"] = data["keep_count"]
        row["maintenance_rows"] = 0  # activity_count restarts at the baseline
        row["transcript_generation"] = data["transcript_generation"]
        row["transcript_generation_baseline"] = data["keep_count"]
        if "last_run_state" in data:  # the last run of the rows kept (older logs: unsaid)
            row["last_run_state"] = data["last_run_state"]
    elif event.type == ev.BRANCH_SWITCHED:
        # Like a truncate (the rows of the branch left are hidden), but not activity: the
        # baseline is everything now shown, so no client marks the switch unread (inv. 4).
        row["message_count"] = data["message_count"]
        row["maintenance_rows"] = 0
        root_titles = row.get("root_titles", {})
        if data.get("row_id") in root_titles:  # another first message: it names the session
            row["title_from_message"] = root_titles[data["row_id"]]
        if "last_run_state" in data:  # the last run of the branch shown
            row["last_run_state"] = data["last_run_state"]
        row["transcript_generation"] = data["transcript_generation"]
        row["transcript_generation_baseline"] = data["message_count"]
    elif event.type == ev.SESSION_ROTATED:
        row["continuation_session_id"] = data.get("continuation_session_id")
    elif event.type == ev.AGENT_IMPORTED:
        _fold_imported(row, data)
    return row


def _fold_imported(row: dict[str, Any], data: dict[str, Any]) -> None:
    """Turns another client of the agent wrote are the user's activity, at the time they
    were written there (never later than that: importing them is not activity)."""
    for entry in data.get("entries") or []:
        rows = entry.get("rows") or [] if entry.get("kind") == "turn" else []
        if not rows:
            continue
        user = rows[0]["role"] == "user"
        row["message_count"] += int(user) + int(len(rows) > int(user))  # user row, reply row
        written = max(r["timestamp"] for r in rows)
        if written > (row["last_message_at"] or 0):
            row["last_message_at"] = written
        row["updated_at"] = max(row["updated_at"], written)
        if user and row["title_from_message"] is None:
            row["title_from_message"] = title_from_message(rows[0].get("content") or "") or None


def public_title(state: dict[str, Any]) -> str:
    return state["title"] or state["title_from_message"] or DEFAULT_TITLE


def public_row(state: dict[str, Any], *, busy: bool, active_stream_id: str | None) -> dict:
    """The `Row` of docs/api.md §3: the persisted fold plus the run registry's two predicates."""
    return {
        "session_id": state["session_id"],
        "title": public_title(state),
        "created_at": state["created_at"],
        "updated_at": state["updated_at"],
        "last_message_at": state["last_message_at"],
        "pinned": state["pinned"],
        "archived": state["archived"],
        "message_count": state["message_count"],
        "activity_count": state["message_count"] - state["maintenance_rows"],
        "transcript_generation": state["transcript_generation"],
        "transcript_generation_baseline": state["transcript_generation_baseline"],
        "busy": busy,
        "active_stream_id": active_stream_id,
        "parent_session_id": state["parent_session_id"],
        "continuation_session_id": state["continuation_session_id"],
        "last_run_state": state.get("last_run_state"),
        "model": state.get("model"),
        "system_prompt": state.get("system_prompt"),
    }


def sort_key(state: dict[str, Any]) -> tuple:
    """Pinned first, then most recent meaningful activity."""
    return (not state["pinned"], -state["updated_at"], state["session_id"])
