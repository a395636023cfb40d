"""Sessions: docs/api.md §3.

The read routes return a ready `JSONResponse`: their bodies are plain JSON built from the log,
and a returned dict would be walked by FastAPI's `jsonable_encoder` first (about 2 ms for a
90-message transcript, on the event loop, for every read; contract invariant 7). The list's
body comes encoded from the session layer, which keeps each row's text between lists."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from tether.http.deps import App
from tether.http.errors import documented
from tether.http.schemas import (
    CreateSession,
    Ok,
    PatchSession,
    SessionContext,
    SessionIdQuery,
    SessionList,
    SessionRowOut,
    SessionStatus,
    SessionViewOut,
    SwitchBranch,
    TruncateSession,
)
from tether.log import SessionNotFound

router = APIRouter(tags=["sessions"])


@router.post(
    "/api/sessions",
    status_code=201,
    summary="Create a session",
    response_model=None,
    responses=documented(400, 413, 503, ok=SessionRowOut, status=201),
)
async def create_session(app: App, body: CreateSession | None = None) -> dict:
    """Create an empty session. `title` is optional (1-200 characters once trimmed); without
    one the session is called "New chat" until its first message names it."""
    row = await app.sessions.create(body.title if body else None)
    app.engine.runtime.prepare(row["session_id"])  # its first turn finds the agent built
    return {"session": row}


@router.get(
    "/api/sessions",
    summary="List sessions",
    response_model=None,
    responses=documented(400, ok=SessionList),
)
async def list_sessions(
    app: App,
    archived: Annotated[
        bool,
        Query(description="List only archived sessions (`archived=1`) instead of the default list"),
    ] = False,
    q: Annotated[
        str | None, Query(description="Case-insensitive search in titles and message text")
    ] = None,
) -> Response:
    """Sidebar rows, pinned first, then most recent meaningful activity first. The default
    list omits archived sessions and rotated parents."""
    query = q.strip() if q else None
    body = await app.sessions.list_json(archived=archived, query=query or None)
    return Response(body, media_type="application/json")


@router.get(
    "/api/session",
    summary="Get a session",
    response_model=None,
    responses=documented(400, 404, ok=SessionViewOut),
)
async def get_session(app: App, session_id: SessionIdQuery) -> JSONResponse:
    """The row plus the visible transcript, the pending turn, the live run's scene and
    `last_seq`, the log position it reflects. A read never writes."""
    return JSONResponse({"session": await app.sessions.view(session_id)})


@router.patch(
    "/api/session",
    summary="Rename, pin, archive a session or set its model and system prompt",
    response_model=None,
    responses=documented(400, 404, 413, 503, ok=SessionRowOut),
)
async def patch_session(app: App, body: PatchSession) -> dict:
    """Change `title`, `pinned`, `archived`, `model` and/or `system_prompt` (at least one;
    `null` model or system prompt: back to the server default). Metadata only: it never
    moves `updated_at`, and an unchanged value appends nothing."""
    changes = {
        key: value
        for key, value in body.model_dump(exclude_unset=True, exclude={"session_id"}).items()
        if value is not None or key in ("model", "system_prompt")
    }
    return {"session": await app.sessions.patch(body.session_id, changes)}


@router.delete(
    "/api/session",
    summary="Delete a session",
    response_model=None,
    responses=documented(400, 404, 409, 503, ok=Ok),
)
async def delete_session(app: App, session_id: SessionIdQuery) -> dict:
    """Delete the session with its log, journal and attachments; 409 `session_busy` while a
    run occupies it."""
    await app.sessions.delete(session_id)
    return {"ok": True}


@router.get(
    "/api/session/context",
    summary="The model context of a session",
    response_model=None,
    responses=documented(400, 404, ok=SessionContext),
)
async def session_context(app: App, session_id: SessionIdQuery) -> JSONResponse:
    """Exactly what the next model call of this session would receive, in the OpenAI message
    shape, compression summaries included, with the turns left out and why."""
    return JSONResponse(await app.sessions.context(session_id, app.engine.runtime.name))


@router.post(
    "/api/session/truncate",
    summary="Truncate the transcript",
    response_model=None,
    responses=documented(400, 404, 409, 413, 503, ok=SessionRowOut),
)
async def truncate_session(app: App, body: TruncateSession) -> dict:
    """Keep the first `keep_count` visible messages (retry, edit and undo are a truncate
    followed by a new turn). 400 when `keep_count` exceeds the transcript; 409
    `session_busy` while a run occupies the session; 409 `session_rotated` (with
    `continuation_session_id`) on a session that continues in a newer one."""
    return {"session": await app.sessions.truncate(body.session_id, body.keep_count)}


@router.post(
    "/api/session/branch",
    summary="Show another branch",
    response_model=None,
    responses=documented(400, 404, 409, 413, 503, ok=SessionViewOut),
)
async def switch_branch(app: App, body: SwitchBranch) -> JSONResponse:
    """Show branch `index` (1-based) of the fork at the visible row `row_id` (a row that
    carries `branch`): the transcript and the model's next context then follow it. Not
    activity: `updated_at` stays. It bumps `transcript_generation`, since the branch left
    is hidden. 409 `session_busy` while a run occupies the session, `session_rotated` on a
    session that continues in a newer one; 404 `row_not_found` for a row not shown."""
    session = await app.sessions.switch_branch(body.session_id, body.row_id, body.index)
    return JSONResponse({"session": session})


@router.get(
    "/api/session/status",
    summary="Run status of a session",
    response_model=None,
    responses=documented(400, 404, ok=SessionStatus),
)
async def session_status(app: App, session_id: SessionIdQuery) -> dict:
    """Whether a worker occupies the session, the run a browser may attach to, its phase
    (`idle`, `starting`, `running`, `cancelling`) and the log position."""
    occupied = await app.sessions.occupancy_of(session_id)
    last_seq = await app.store.last_seq(session_id)
    if last_seq is None:
        raise SessionNotFound(session_id)
    return {**occupied._asdict(), "last_seq": last_seq}
