"""Runs: docs/api.md §4 (start, Stop) and the attachments that turns refer to."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import FileResponse

from tether.errors import AttachmentNotFound, InvalidRequest
from tether.events import ID_PATTERN
from tether.http.deps import App
from tether.http.errors import documented
from tether.http.schemas import (
    AnswerQuestion,
    AnswerResult,
    ApproveResult,
    ApproveRun,
    CancelResult,
    CancelRun,
    EditQueued,
    QueueChanged,
    Queued,
    QueueIdQuery,
    QueueMessage,
    RegenerateTurn,
    StartQueued,
    StartTurn,
    SteerResult,
    SteerRun,
    TurnStarted,
)
from tether.runs.intake import check_message, decode_uploads
from tether.runtimes.base import ChoiceNotOffered
from tether.visible_text import shown_file_name

router = APIRouter(tags=["runs"])

# Served inline only for types a browser renders without running anything.
_INLINE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}


@router.post(
    "/api/chat/start",
    summary="Start a turn",
    response_model=None,
    responses=documented(400, 404, 409, 413, 503, ok=TurnStarted),
)
async def start_turn(app: App, body: StartTurn) -> dict:
    """Record the user's message (with optional base64 attachments) and start a run. The
    turn is durable, and visible in `GET /api/session`, before this returns. 409
    `session_busy` while any worker occupies the session, `session_rotated` after a
    compression rotation; every refusal comes before any write. With `edit_of` (a user
    row of the transcript shown) the message replaces that one and everything after it as
    a new branch; the old branch is kept (404 `row_not_found` for a row not shown). With
    `after_seq` (where the sender's view was folded to), 409 `transcript_changed` when
    rows of that view were hidden since (another tab switched branch, edited or cut)."""
    text = check_message(
        body.message, app.settings, with_files=bool(body.attachments or body.keep_attachments)
    )
    uploads = decode_uploads(
        [a.model_dump() for a in body.attachments], app.settings, app.engine.runtime
    )
    return await app.engine.start(
        body.session_id,
        text,
        uploads,
        body.model,
        edit_of=body.edit_of,
        keep_attachments=body.keep_attachments,
        max_attachments=app.settings.max_attachments,
        after_seq=body.after_seq,
    )


@router.post(
    "/api/chat/regenerate",
    summary="Regenerate an answer",
    response_model=None,
    responses=documented(400, 404, 409, 413, 503, ok=TurnStarted),
)
async def regenerate_turn(app: App, body: RegenerateTurn) -> dict:
    """A new run answers again the message that the answer `row_id` (default: the last
    one) answered, as a new branch; the old answer is kept. The same answer as
    `chat/start`, and the same 409s (`session_busy`, `session_rotated`, with `after_seq`
    `transcript_changed`: a view another tab changed, or without `row_id` one that lacks
    the last answer), before any write; 404 `row_not_found` for a row not shown. Retry
    after a Stop or an error is this."""
    return await app.engine.regenerate(body.session_id, body.row_id, body.model, body.after_seq)


@router.post(
    "/api/chat/steer",
    summary="Steer a running agent",
    response_model=None,
    responses=documented(400, 413, ok=SteerResult),
)
async def steer_run(app: App, body: SteerRun) -> dict:
    """Text for the running agent to see at its next step; `accepted` is false (with a
    `reason`) when the run is no longer running."""
    return await app.controls.steer(body.stream_id, check_message(body.text, app.settings))


@router.post(
    "/api/chat/approve",
    summary="Answer an approval prompt",
    response_model=None,
    responses=documented(400, 413, ok=ApproveResult),
)
async def approve_run(app: App, body: ApproveRun) -> Any:
    """Allow (`once`, `session`, `always`) or refuse (`deny`) the command a running agent
    asked about (`approval.requested`, whose `choices` say which it offers). `accepted` is
    false when that prompt was already answered, timed out, or its run ended; a choice it
    does not offer is 400. Nothing changes then."""
    try:
        return await app.controls.approve(body.stream_id, body.approval_id, body.choice)
    except ChoiceNotOffered as exc:
        raise InvalidRequest(str(exc)) from None


@router.post(
    "/api/chat/answer",
    summary="Answer a question of the agent",
    response_model=None,
    responses=documented(400, 413, ok=AnswerResult),
)
async def answer_question(app: App, body: AnswerQuestion) -> dict:
    """The user's answer to a question a running agent asked (`clarify.requested`): free
    text or one of its choices. `accepted` is false when that question was already
    answered, timed out, or its run ended; nothing changes then."""
    text = check_message(body.text, app.settings)
    return await app.controls.answer(body.stream_id, body.question_id, text)


@router.post(
    "/api/chat/queue",
    summary="Queue a message",
    response_model=None,
    responses=documented(400, 404, 409, 413, 503, ok=Queued),
)
async def queue_message(app: App, body: QueueMessage) -> dict:
    """A message typed while the session is busy: it starts as the next turn when the run
    completes (at once when the session is idle) and survives reloads and restarts. With
    `after_seq`, one that would start at once from a view whose rows were hidden since is
    409 `transcript_changed`, and nothing is queued; behind a run the position is not
    checked (it is sent against what is shown when it starts)."""
    text = check_message(body.message, app.settings, with_files=bool(body.attachments))
    uploads = decode_uploads(
        [a.model_dump() for a in body.attachments], app.settings, app.engine.runtime
    )
    return await app.queue.add(body.session_id, text, uploads, body.after_seq)


@router.patch(
    "/api/chat/queue",
    summary="Edit a queued message",
    response_model=None,
    responses=documented(400, 404, 413, 503, ok=QueueChanged),
)
async def edit_queued(app: App, queue_id: QueueIdQuery, body: EditQueued) -> dict:
    """Replace the text of a message that is still queued; 404 `queue_item_not_found` once
    it was sent or removed."""
    return await app.queue.update(queue_id, check_message(body.text, app.settings))


@router.delete(
    "/api/chat/queue",
    summary="Remove a queued message",
    response_model=None,
    responses=documented(400, 404, 503, ok=QueueChanged),
)
async def remove_queued(app: App, queue_id: QueueIdQuery) -> dict:
    """Remove a message that is still queued; 404 `queue_item_not_found` once it was sent or
    removed."""
    return await app.queue.remove(queue_id)


@router.post(
    "/api/chat/queue/start",
    summary="Send a queued message now",
    response_model=None,
    responses=documented(400, 404, 409, 503, ok=TurnStarted),
)
async def start_queued(app: App, body: StartQueued) -> dict:
    """Start a queued message as the turn at once, while the session is idle (after a Stop
    or an error the queue waits for the user): the same answer as `chat/start`, and the item
    leaves the queue. 409 `session_busy` while a run is active (it stays queued); 404
    `queue_item_not_found` once it was sent or removed; with `after_seq`, 409
    `transcript_changed` (it stays queued) as for `chat/start`."""
    return await app.queue.start(body.queue_id, body.after_seq)


@router.post(
    "/api/chat/cancel",
    summary="Stop a run",
    response_model=None,
    responses=documented(400, 413, ok=CancelResult),
)
async def cancel_run(app: App, body: CancelRun) -> dict:
    """Stop the run `stream_id` (or the session's run, given `session_id`). Idempotent:
    `cancelled` is false for an unknown or already finished run; 400 without either id."""
    if body.stream_id is None and body.session_id is None:
        raise InvalidRequest("Send the stream_id (or session_id) to stop.")
    return await app.controls.cancel(stream_id=body.stream_id, session_id=body.session_id)


_BINARY = {"schema": {"type": "string", "format": "binary"}}


@router.get(
    "/api/attachments/{attachment_id}",
    summary="Download an attachment",
    response_class=FileResponse,
    response_model=None,
    responses=documented(
        400,
        404,
        content={mime: _BINARY for mime in [*sorted(_INLINE_TYPES), "application/octet-stream"]},
    ),
)
async def get_attachment(
    app: App,
    attachment_id: str = Path(pattern=ID_PATTERN, description="An attachment id"),
    session_id: str = Query(
        "",  # absent: the upload, if exactly one session holds that id
        pattern=ID_PATTERN,
        description="The session that holds the upload (the transcript's `url` names it)",
    ),
) -> object:
    """The stored bytes, under the name and type given in the session that uploaded them.
    Images a browser renders without running anything are served inline; everything else is
    a download (`application/octet-stream`). 404 when `session_id` does not hold the upload."""
    upload = await app.store.attachment(attachment_id, session_id or None)
    path = None if upload is None else await app.attachments.path(upload["blob"])
    if upload is None or path is None:
        raise AttachmentNotFound("There is no such attachment.")
    mime = upload["mime"] if upload["mime"] in _INLINE_TYPES else "application/octet-stream"
    return FileResponse(
        path,
        media_type=mime,
        # a name stored before names were cleaned may hold a bidi override (docs/security.md)
        filename=shown_file_name(upload["name"]),
        content_disposition_type="inline" if mime in _INLINE_TYPES else "attachment",
        headers={
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, max-age=3600",
            # the browser's copy is for whoever signed in when it was read: after a log out,
            # the next person's request (another cookie) asks the server, which says 404
            "Vary": "Cookie, Authorization",
            "Content-Security-Policy": "default-src 'none'; sandbox",
        },
    )
