"""Every error leaves as `{code, message, ...}` with the status API.md §2 gives its class.
Validation failures are 400 (never 422); nothing unexpected leaks a traceback."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.log import SessionNotFound, StorageError
from tether.sessions.service import SessionError

log = logging.getLogger("tether.http")

_SESSION_ERROR_STATUS = {
    "invalid_request": 400,
    "session_busy": 409,
    "session_rotated": 409,
    "payload_too_large": 413,
    "server_closing": 503,
    "queue_item_not_found": 404,
}
_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
}


def error(status: int, code: str, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **extra}, status_code=status)


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query"))
        if err.get("type") == "json_invalid":
            return "The request body is not valid JSON."
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else err.get("msg", ""))
    return "; ".join(parts) or "The request is not valid."


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, "invalid_request", _describe(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else "Request failed."
        if exc.status_code == 404:
            message = "No such page or API route."
        return error(exc.status_code, code, message)

    @app.exception_handler(SessionNotFound)
    async def _not_found(_: Request, exc: SessionNotFound) -> JSONResponse:
        return error(404, "session_not_found", f"There is no session {exc.session_id}.")

    @app.exception_handler(SessionError)
    async def _session(_: Request, exc: SessionError) -> JSONResponse:
        return error(_SESSION_ERROR_STATUS.get(exc.code, 400), exc.code, exc.message, **exc.extra)

    @app.exception_handler(StorageError)
    async def _storage(_: Request, exc: StorageError) -> JSONResponse:
        log.error("storage error: %s", exc)
        return error(
            503,
            "storage_unavailable",
            f"Tether could not write to its database; nothing was changed. Details: {exc}",
        )

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error(500, "internal", "Tether hit an internal error; see the server log.")
