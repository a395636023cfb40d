"""Every error leaves as `{code, message, ...}`: the API's error family (`tether.errors`)
carries each code and status, and one handler here answers for all of them (docs/api.md §2).
Validation failures are 400 (never 422); nothing unexpected leaks a traceback."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.errors import (
    ApiError,
    Forbidden,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    PayloadTooLarge,
    RouteNotFound,
    Unauthenticated,
)
from tether.http.schemas import ErrorBody
from tether.log import StorageError

log = logging.getLogger("tether.http")

# Starlette's own refusals (an unknown route, a wrong method, ...), as members of the family.
_FOR_HTTP_STATUS: dict[int, type[ApiError]] = {
    cls.status: cls
    for cls in (
        InvalidRequest,
        Unauthenticated,
        Forbidden,
        RouteNotFound,
        MethodNotAllowed,
        PayloadTooLarge,
    )
}


_DESCRIPTIONS = {
    400: "Bad input (`invalid_request`): a body that is not a JSON object, a wrong type, an "
    "id outside `[A-Za-z0-9_-]{1,64}`, required text that is empty, or text that is not "
    "valid Unicode. Never 422.",
    401: "`bad_credentials` (a sign-in that does not match) or `unauthenticated` (no valid "
    "cookie, token or trusted header).",
    403: "`forbidden`: an admin route (docs/api.md §15) asked by someone who is not one.",
    404: "Unknown id (`session_not_found`, `queue_item_not_found`, `user_not_found`, "
    "`token_not_found`, ...); another person's session is unknown too. The account routes "
    "answer `not_found` when accounts are off.",
    409: "State conflict: `session_busy` (with `active_stream_id`), `session_rotated` "
    "(with `continuation_session_id`) or `user_exists`.",
    413: "Too large (`payload_too_large`): the request body, an attachment or the message.",
    429: "Too many (`too_many_streams`: this client's open event streams are at the limit; "
    "`rate_limited`: too many failed sign-ins, with `retry_after`).",
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


def error_response(exc: ApiError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


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
        return error_response(InvalidRequest(_describe(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "Request failed."
        if exc.status_code == 404:
            message = "No such page or API route."
        family = _FOR_HTTP_STATUS.get(exc.status_code)
        if family is None:  # a status no route of Tether's raises
            return JSONResponse({"code": "error", "message": message}, exc.status_code)
        return error_response(family(message), exc.headers)  # a 405 keeps its Allow

    @app.exception_handler(ApiError)
    async def _refused(_: Request, exc: ApiError) -> JSONResponse:
        if isinstance(exc, StorageError):
            log.error("storage error: %s", exc)
        return error_response(exc)

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(InternalError("Tether hit an internal error; see the server log."))
