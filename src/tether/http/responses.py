"""Responses for routes whose bodies are already plain JSON (dicts and lists built from the
log). FastAPI walks a returned dict with `jsonable_encoder` before serialising it: about 2 ms
for a 90-message transcript, on the event loop, for every read. A `JSONResponse` returned
as-is skips that walk (contract invariant 7: reads must not stall behind the streams)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


def plain_json(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body)
