"""Edit, regenerate and branch switching (docs/api.md §10): which events each one appends.

A new branch is the log's ordinary truncate (`transcript.truncated`), which hides the rows
from the fork on without removing them (projections/branches.py), followed in the same
append by the new turn: `turn.submitted{edit_of}` for an edited message, or
`turn.submitted{regenerate}` (no new user row) for a new answer to a turn already shown.
Showing another branch is `branch.switched`; a new message, an edit or a regenerate sent
from a view that one of them changed since is refused (`shown_generation`). Every check
here reads the fold under the session's lock, before anything is written, so a refusal
leaves the log untouched.
"""

from __future__ import annotations

from typing import Any

from tether import events as ev
from tether.errors import InvalidRequest, RowNotFound, TranscriptChanged
from tether.log import Draft
from tether.log.errors import TRANSCRIPT_CHANGED
from tether.sessions.folds import SessionFold


def _visible_index(fold: SessionFold, row_id: str) -> int:
    for index, row in enumerate(fold.transcript.messages):
        if row["id"] == row_id:
            return index
    raise RowNotFound(
        "There is no such message in the transcript shown (another tab may have switched "
        "branch; reload the session).",
        row_id=row_id,
    )


def last_run_state(fold: SessionFold, rows: list[dict[str, Any]]) -> str | None:
    """How the last run among `rows` ended, for the sidebar's mark (`last_run_state`, which
    follows the rows shown): the state of the last answer, skipping those a restart or a
    shutdown settled (maintenance, which never sets the mark); None without one."""
    assert fold.row is not None
    maintenance = set(fold.row.get("maintenance_runs", ()))
    for row in reversed(rows):
        if row["role"] == "assistant" and row.get("stream_id") not in maintenance:
            return row.get("state", "completed")
    return None


def shown_generation(fold: SessionFold, after_seq: int, *, last_row: bool = False) -> int:
    """For a new message, an edit or a regenerate sent from a view of the transcript folded
    to `after_seq` (docs/api.md §4, §10): the session's `transcript_generation` when no row
    of that view was hidden since, for the command's `Draft.shown_generation`; else 409
    `transcript_changed`. Only a truncate and a branch switch hide rows (an edit and a
    regenerate of a shown answer are a truncate and their turn); what appends after the
    view (answers, renames, other messages, queued ones) leaves it a prefix of what the
    model gets. With `last_row` (a regenerate of "the last answer", no row named) a row
    added since refuses it too: the last answer would be one the view never had. A position
    past the log is no view of it."""
    assert fold.row is not None
    transcript = fold.transcript
    if after_seq > fold.last_seq or transcript.hidden_at > after_seq:
        raise TranscriptChanged(TRANSCRIPT_CHANGED)
    if last_row and transcript.grown_at > after_seq:
        raise TranscriptChanged(TRANSCRIPT_CHANGED)
    generation: int = fold.row["transcript_generation"]
    return generation


def truncate_draft(fold: SessionFold, keep: int) -> Draft:
    """The truncate that hides the visible rows from position `keep` on (a new branch
    starts there)."""
    assert fold.row is not None
    return Draft(
        ev.TRANSCRIPT_TRUNCATED,
        {
            "keep_count": keep,
            "transcript_generation": fold.row["transcript_generation"] + 1,
            "last_run_state": last_run_state(fold, fold.transcript.messages[:keep]),
        },
        needs_no_run=True,
        after_seq=fold.last_seq,  # several replicas: not if another one wrote since
    )


def edit_fork(
    fold: SessionFold, row_id: str, keep_attachments: list[str] | None
) -> tuple[list[Draft], list[dict[str, Any]]]:
    """For `chat/start {edit_of}`: (the drafts before the new turn, the attachments of the
    edited message it keeps: all of them unless `keep_attachments` names some)."""
    index = _visible_index(fold, row_id)
    row = fold.transcript.messages[index]
    if row["role"] != "user":
        raise InvalidRequest("edit_of names an answer; only your own messages can be edited.")
    owned = [{k: v for k, v in a.items() if k != "url"} for a in row.get("attachments") or []]
    if keep_attachments is not None:
        unknown = sorted(set(keep_attachments) - {a["id"] for a in owned})
        if unknown:
            raise InvalidRequest(
                f"keep_attachments names {', '.join(unknown)}, not an attachment of the "
                "message edited."
            )
        owned = [a for a in owned if a["id"] in keep_attachments]
    return [truncate_draft(fold, index)], owned


def regenerate_fork(fold: SessionFold, row_id: str | None) -> tuple[list[Draft], str, str | None]:
    """For `chat/regenerate`: (the drafts before the new run, the turn it answers, the
    answer it replaces). Without `row_id`: the last answer, or, when the transcript ends
    with a message nobody answered yet, that message (nothing is hidden then, and the new
    turn itself carries the fold's `after_seq`: runs/engine.py `regenerate`)."""
    messages = fold.transcript.messages
    if row_id is None:
        if messages and messages[-1]["role"] == "user":
            return [], messages[-1]["turn_id"], None
        answers = [row["id"] for row in messages if row["role"] == "assistant"]
        if not answers:
            raise InvalidRequest("There is no answer to regenerate yet.")
        row_id = answers[-1]
    index = _visible_index(fold, row_id)
    row = messages[index]
    if row["role"] != "assistant":
        raise InvalidRequest("row_id names your own message; regenerate takes an answer.")
    asked = messages[index - 1] if index > 0 else None
    if asked is None or asked["role"] != "user" or asked["turn_id"] != row["turn_id"]:
        raise InvalidRequest("That answer has no message of yours before it to answer again.")
    return [truncate_draft(fold, index)], row["turn_id"], row_id


def switch_draft(fold: SessionFold, row_id: str, index: int) -> Draft | None:
    """`POST /api/session/branch`: the `branch.switched` that shows branch `index` (1-based)
    of the fork at the visible row `row_id`, or None when it is shown already."""
    assert fold.row is not None
    _visible_index(fold, row_id)
    tree = fold.transcript.tree
    siblings = tree.siblings(row_id)
    if len(siblings) < 2:
        raise InvalidRequest("This message has no other branch to show.")
    if not 1 <= index <= len(siblings):
        raise InvalidRequest(f"index must be between 1 and {len(siblings)} here.")
    target = siblings[index - 1]
    if target == row_id:
        return None
    path = tree.path_if_shown(target)
    return Draft(
        ev.BRANCH_SWITCHED,
        {
            "row_id": target,
            "index": index,
            "message_count": len(path),
            "transcript_generation": fold.row["transcript_generation"] + 1,
            "last_run_state": last_run_state(fold, path),
        },
        needs_no_run=True,
        after_seq=fold.last_seq,
    )
