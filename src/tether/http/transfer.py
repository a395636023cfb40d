"""Export and import: docs/api.md §12.

Exports are reads (they never write); the all-sessions export streams one session per line,
never the whole file in memory. An import is checked in a child process and written in one
transaction (`sessions/transfer/`); its progress can be polled by the id the client chose.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from tether.errors import ImportIncomplete, RenderBusy, RenderUnavailable
from tether.events import ID_PATTERN
from tether.http.deps import App
from tether.http.errors import documented
from tether.http.render_pool import RenderFailed, RenderQueueFull
from tether.http.schemas import ImportProgress, ImportResult
from tether.log import SessionNotFound
from tether.sessions.transfer import exporter

router = APIRouter(tags=["export and import"])

IMPORT_PATH = "/api/sessions/import"
_DOWNLOAD = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_TEXT = {"schema": {"type": "string"}}
_CHATGPT = {
    "type": "array",
    "items": {"type": "object", "required": ["mapping"], "properties": {"mapping": {}}},
}
# Tether's JSON form (docs/api.md §12), as far as a schema can say it.
_SESSION_JSON = {
    "schema": {
        "type": "object",
        "required": ["format", "version", "events", "attachments"],
        "properties": {
            "format": {"type": "string", "enum": ["tether.session"]},
            "version": {"type": "integer"},
            "exported_at": {"type": "number"},
            "session_id": {"type": "string"},
            "events": {"type": "array", "items": {"type": "object"}},
            "attachments": {"type": "array", "items": {"type": "object"}},
            "missing_attachments": {"type": "array", "items": {"type": "object"}},
        },
    }
}


_IMPORT_BODY = {"schema": {"oneOf": [_SESSION_JSON["schema"], _CHATGPT]}}


@router.get(
    "/api/sessions/{session_id}/export",
    summary="Export a session",
    response_model=None,
    responses=documented(
        400, 404, 503, content={"application/json": _SESSION_JSON, "text/markdown": _TEXT}
    ),
)
async def export_session(
    app: App,
    request: Request,
    session_id: Annotated[str, Path(pattern=ID_PATTERN, description="A session id")],
    format: Annotated[  # noqa: A002 - the query parameter's name
        Literal["json", "markdown"],
        Query(description="`json` (Tether's, re-importable) or `markdown`"),
    ] = "json",
) -> Response:
    """The session as a download: `json` is its log and attachments (importing it gives
    back the same transcript, branches and attachments), `markdown` its visible transcript
    (written in the render worker: 503 when it is busy or stopped, as `POST /api/render`)."""
    if await app.store.last_seq(session_id) is None:
        raise SessionNotFound(session_id)
    if format == "markdown":
        try:
            title, text = await exporter.session_markdown(
                app.sessions, session_id, request.app.state.renderer.run
            )
        except RenderQueueFull:
            raise RenderBusy(
                "Too many exports and renders wait for the worker; retry soon."
            ) from None
        except RenderFailed:
            raise RenderUnavailable("The render worker stopped; retry.") from None
        headers = {**_DOWNLOAD, "Content-Disposition": exporter.attachment_header(title, "md")}
        return Response(text, media_type="text/markdown; charset=utf-8", headers=headers)
    row = await app.sessions.row(session_id)
    title = row["title"] if row else "session"
    body = await exporter.session_json(app.sessions, session_id)
    headers = {**_DOWNLOAD, "Content-Disposition": exporter.attachment_header(title, "json")}
    return Response(body, media_type="application/json", headers=headers)


@router.get(
    "/api/export",
    summary="Export every session",
    response_model=None,
    response_class=StreamingResponse,
    responses=documented(content={"application/x-ndjson": _TEXT}),
)
async def export_all(app: App) -> StreamingResponse:
    """Every session in Tether's JSON form, one per line (JSON lines), oldest first,
    streamed as each is read."""
    headers = {
        **_DOWNLOAD,
        "Content-Disposition": 'attachment; filename="tether-sessions.jsonl"',
    }
    return StreamingResponse(
        exporter.all_sessions(app.sessions), media_type="application/x-ndjson", headers=headers
    )


@router.post(
    IMPORT_PATH,
    status_code=201,
    summary="Import sessions",
    response_model=None,
    responses=documented(400, 413, 503, ok=ImportResult, status=201),
    openapi_extra={
        "requestBody": {
            "required": True,
            # JSON lines (the all-sessions file) are taken too, under any content type
            "content": {"application/json": _IMPORT_BODY},
        }
    },
)
async def import_sessions(
    app: App,
    request: Request,
    import_id: Annotated[
        str,
        Query(pattern=ID_PATTERN, description="Your id for this import, to poll its progress"),
    ] = "",  # absent: no progress to poll
) -> Response:
    """A Tether export (one session, or the all-sessions file) or ChatGPT's
    `conversations.json`, as the request body. 201 with the rows; 200 when every session was
    imported before (nothing is created twice). A file that is wrong in any way is a 400
    naming what is wrong, and nothing of it is written."""
    job = app.importer.jobs.open(import_id or None)
    status, body = await app.importer.run(_upload(request), job)
    return Response(body, status_code=status, media_type="application/json")


async def _upload(request: Request) -> AsyncIterator[bytes]:
    """The file's chunks as they come. An upload cut short (the client gone, or the body's
    deadline passed, http/slow_clients.py) is refused as such, so its job ends failed."""
    try:
        async for chunk in request.stream():
            if chunk:
                yield chunk
    except ClientDisconnect:
        raise ImportIncomplete(
            "The upload ended before the whole file arrived; nothing of it was imported."
        ) from None


@router.get(
    "/api/imports/{import_id}",
    summary="Progress of an import",
    response_model=None,
    responses=documented(400, 404, ok=ImportProgress),
)
async def import_progress(
    app: App,
    import_id: Annotated[str, Path(pattern=ID_PATTERN, description="The id given to the import")],
) -> dict:
    """`phase` is `reading`, `checking` (`done` of `total` sessions), `writing`, `done` or
    `failed` (with `error`, the import's error body). Kept ten minutes after it ends."""
    return app.importer.jobs.get(import_id).view()
