"""Sessions: API.md §3."""

from __future__ import annotations

from fastapi import APIRouter

from tether.http.deps import App
from tether.http.schemas import CreateSession, PatchSession, SessionIdQuery, TruncateSession
from tether.log import SessionNotFound

router = APIRouter()


@router.post("/api/sessions", status_code=201)
async def create_session(app: App, body: CreateSession | None = None) -> dict:
    row = await app.sessions.create(body.title if body else None)
    return {"session": row}


@router.get("/api/sessions")
async def list_sessions(app: App, archived: bool = False, q: str | None = None) -> dict:
    query = q.strip() if q else None
    return {"sessions": await app.sessions.list_rows(archived=archived, query=query or None)}


@router.get("/api/session")
async def get_session(app: App, session_id: SessionIdQuery) -> dict:
    return {"session": await app.sessions.view(session_id)}


@router.patch("/api/session")
async def patch_session(app: App, body: PatchSession) -> dict:
    changes = body.model_dump(exclude_none=True, exclude={"session_id"})
    return {"session": await app.sessions.patch(body.session_id, changes)}


@router.delete("/api/session")
async def delete_session(app: App, session_id: SessionIdQuery) -> dict:
    await app.sessions.delete(session_id)
    return {"ok": True}


@router.get("/api/session/context")
async def session_context(app: App, session_id: SessionIdQuery) -> dict:
    return await app.sessions.context(session_id)


@router.post("/api/session/truncate")
async def truncate_session(app: App, body: TruncateSession) -> dict:
    return {"session": await app.sessions.truncate(body.session_id, body.keep_count)}


@router.get("/api/session/status")
async def session_status(app: App, session_id: SessionIdQuery) -> dict:
    last_seq = app.store.last_seq(session_id)
    if last_seq is None:
        raise SessionNotFound(session_id)
    return {
        "busy": app.registry.busy(session_id),
        "active_stream_id": app.registry.attachable_stream(session_id),
        "phase": app.registry.phase(session_id),
        "last_seq": last_seq,
    }
