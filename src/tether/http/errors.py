"""Every error leaves as `{code, message, ...}` with the status API.md §2 gives its class.
Validation failures are 400 (never 422); nothing unexpected leaks a traceback."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.http.schemas import ErrorBody
from tether.log import SessionNotFound, StorageError
from tether.log.errors import InvalidEvent
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


_DESCRIPTIONS = {
    400: "Bad input (`invalid_request`): a body that is not a JSON object, a wrong type, an "
    "id outside `[A-Za-z0-9_-]{1,64}`, required text that is empty, or text that is not "
    "valid Unicode. Never 422.",
    404: "Unknown id (`session_not_found`, `queue_item_not_found`, ...).",
    409: "State conflict: `session_busy` (with `active_stream_id`) or `session_rotated` "
    "(with `continuation_session_id`).",
    413: "Too large (`payload_too_large`): the request body, an attachment or the message.",
    429: "Too many (`too_many_streams`: this client's open event streams are at the limit).",
    503: "`storage_unavailable` or `server_closing`; nothing was changed.",
}
_ERROR_REF = "#/components/schemas/ErrorBody"


def documented(
    *statuses: int, ok: type | None = None, status: int = 200, content: dict[str, Any] | None = None
) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: its success body (`ok`, a documentation model, or raw
    `content`) and the error statuses it can answer, each with the common `ErrorBody`."""
    out: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody, "description": _DESCRIPTIONS[code]} for code in statuses
    }
    if ok is not None:
        out[status] = {"model": ok}
    elif content is not None:
        out[status] = {"content": content}
    return out


def _document_errors(schema: dict[str, Any]) -> None:
    """FastAPI documents request validation failures as 422 with its own body; here they are
    400 with `ErrorBody` (the handler below), and any body may be refused with 413 by the
    size limit in front of every route."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault("ErrorBody", ErrorBody.model_json_schema(ref_template=_ERROR_REF))
    error_json = {"application/json": {"schema": {"$ref": _ERROR_REF}}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            had_validation = responses.pop("422", None) is not None
            if had_validation and "400" not in responses:
                responses["400"] = {"description": _DESCRIPTIONS[400], "content": error_json}
            if "requestBody" in operation and "413" not in responses:
                responses["413"] = {"description": _DESCRIPTIONS[413], "content": error_json}
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)


def error(status: int, code: str, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **extra}, status_code=status)


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query"))
        if err.get("type") == "json_invalid":
            return "The request body is not valid JSON."
        if err.get("loc") == ("body",) and isinstance(err.get("input"), bytes | bytearray):
            return "Send the request body as JSON (Content-Type: application/json)."
        if err.get("loc") == ("body",) and err.get("type") == "model_attributes_type":
            return "The request body must be a JSON object."
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "The request is not valid."


def install(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _document_errors(generate())
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]

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

    @app.exception_handler(InvalidEvent)
    async def _invalid(_: Request, exc: InvalidEvent) -> JSONResponse:
        return error(400, "invalid_request", f"This cannot be stored: {exc}")

    @app.exception_handler(StorageError)
    async def _storage(_: Request, exc: StorageError) -> JSONResponse:
        log.error("storage error: %s", exc)
        return error(
            503,
            "storage_unavailable",
            f"Tether could not use its storage; nothing was changed. Details: {exc}",
        )

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error(500, "internal", "Tether hit an internal error; see the server log.")
