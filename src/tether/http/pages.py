"""The page: `/` and `/s/<session_id>` serve the app shell; `/static/` its ES modules and CSS
(no build step), and `/static/js/event_types.js` the one module written from the code: the
durable event types the page listens for (`tether.events`); `POST /api/render` turns Markdown
into sanitized HTML for API clients (the page renders Markdown itself, in `web/js/markdown.js`).
"""

from __future__ import annotations

import html
import json
from importlib.resources import files

from fastapi import APIRouter, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response

from tether.errors import InvalidRequest, RenderBusy, RenderTooLarge, RenderUnavailable
from tether.events import ID_PATTERN
from tether.http.errors import documented
from tether.http.render_pool import RenderFailed, RenderQueueFull
from tether.http.schemas import Rendered, RenderRequest

router = APIRouter()
WEB_ROOT = files("tether") / "web"
# Only our own scripts and styles run; model output can never bring its own.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def card_page(title: str, words: str, link: str, label: str, status: int = 200) -> HTMLResponse:
    """A login-card page of a sentence and one button; `words` and `link` are escaped here."""
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="color-scheme" content="light dark"><title>{title} · Tether</title>'
        '<link rel="icon" href="data:,">'
        '<link rel="stylesheet" href="/static/css/app.css">'
        '<link rel="stylesheet" href="/static/css/main.css">'
        '<link rel="stylesheet" href="/static/css/auth.css"></head>'
        '<body><main class="login-shell"><div class="login-card">'
        f'<h1 class="brand login-brand">Tether</h1><p>{html.escape(words)}</p>'
        f'<a class="btn primary login-submit" href="{html.escape(link)}">{label}</a>'
        "</div></main></body></html>"
    )
    return HTMLResponse(page, status_code=status, headers=PAGE_HEADERS)


def _shell() -> HTMLResponse:
    return HTMLResponse((WEB_ROOT / "index.html").read_text(encoding="utf-8"), headers=PAGE_HEADERS)


@router.get("/", include_in_schema=False)
async def app_shell() -> HTMLResponse:
    return _shell()


@router.get("/s/{session_id}", include_in_schema=False)
async def session_shell(session_id: str = Path(pattern=ID_PATTERN)) -> HTMLResponse:
    return _shell()


@router.get("/static/js/event_types.js", include_in_schema=False)
async def event_types_module(request: Request) -> Response:
    """The durable event types, from their definitions: an SSE frame whose name EventSource
    has no listener for is dropped silently, so the page listens for exactly these."""
    names = request.app.state.services.vocabulary.durable_names()
    return Response(
        f"export const EVENT_TYPES = {json.dumps(names)};\n",
        media_type="text/javascript",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
    )


MAX_RENDER_BODY_BYTES = 16 * 1024 * 1024
_RENDER_BODY = {
    "required": True,
    "content": {"application/json": {"schema": RenderRequest.model_json_schema()}},
}


@router.post(
    "/api/render",
    response_model=None,
    responses=documented(400, 413, 503, ok=Rendered),
    openapi_extra={"requestBody": _RENDER_BODY},
)
async def render_markdown(request: Request) -> Response:
    """Markdown to sanitized HTML, one per text (at most 500 texts and 16 MiB a request; a
    text over 50,000 characters comes back as escaped plain text with a note). Rendered in
    a worker process: the server answers everything else meanwhile."""
    content_type = request.headers.get("content-type", "application/json")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise InvalidRequest("Send the request body as JSON (Content-Type: application/json).")
    raw = await request.body()
    if len(raw) > MAX_RENDER_BODY_BYTES:
        raise RenderTooLarge(
            f"At most {MAX_RENDER_BODY_BYTES:,} bytes of texts can be rendered in one "
            "request; send fewer texts at a time.",
            limit_bytes=MAX_RENDER_BODY_BYTES,
        )
    try:
        outcome, result = await request.app.state.renderer.render(raw)
    except RenderQueueFull:
        raise RenderBusy("Too many texts are waiting to be rendered; retry soon.") from None
    except RenderFailed:
        raise RenderUnavailable("The renderer stopped; retry.") from None
    if outcome == "invalid":
        raise RequestValidationError(result)
    return Response(result, media_type="application/json")
