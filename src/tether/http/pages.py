"""The page: `/` and `/s/<session_id>` serve the app shell; `/static/` its ES modules and CSS
(no build step); `POST /api/render` turns Markdown into sanitized HTML for it."""

from __future__ import annotations

from importlib.resources import files
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import HTMLResponse
from pydantic import Field, StrictStr

from tether.events import ID_PATTERN
from tether.http.markdown import render
from tether.http.schemas import Body

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


def _shell() -> HTMLResponse:
    return HTMLResponse((WEB_ROOT / "index.html").read_text(encoding="utf-8"), headers=PAGE_HEADERS)


@router.get("/", include_in_schema=False)
async def app_shell() -> HTMLResponse:
    return _shell()


@router.get("/s/{session_id}", include_in_schema=False)
async def session_shell(session_id: str = Path(pattern=ID_PATTERN)) -> HTMLResponse:
    return _shell()


class RenderRequest(Body):
    texts: Annotated[list[StrictStr], Field(max_length=500)]


@router.post("/api/render")
async def render_markdown(body: RenderRequest) -> dict:
    return {"html": [render(text) for text in body.texts]}
