"""The errors the API can return: one family, each class carrying its stable `code` and its
HTTP status (docs/api.md §2 lists them all). Any layer raises them (the log, the session
layer, the runs, the HTTP routes); the HTTP layer turns the whole family into a
`{code, message, ...}` body in one handler (`http/errors.py`). This module depends on
nothing, so the lowest layer can raise them too.

Errors that never reach a client as such (a provider failure ends the run with
`run.finished`, docs/api.md §4) are not in the family.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ApiError(Exception):
    """An answer the API gives instead of the one asked for. `extra` are the body's fields
    besides `code` and `message` (e.g. `active_stream_id` of `session_busy`). Raise one of
    its subclasses: each names its code and status."""

    code: ClassVar[str]
    status: ClassVar[int]

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.extra = extra

    @property
    def message(self) -> str:
        """For people: what went wrong and, where it helps, what to do."""
        return str(self)

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


class InvalidRequest(ApiError):
    code, status = "invalid_request", 400


# An import refused (docs/api.md §12): each names what is wrong with the file, and nothing
# of it was written. `path` (where given) points into the file, e.g. `events[3].data.text`.
class ImportNotJson(ApiError):
    code, status = "import_not_json", 400


class ImportUnknownFormat(ApiError):
    code, status = "import_unknown_format", 400


class ImportUnsupportedVersion(ApiError):
    code, status = "import_unsupported_version", 400


class ImportInvalid(ApiError):
    code, status = "import_invalid", 400


class ImportTooDeep(ApiError):
    code, status = "import_too_deep", 400


class ImportIncomplete(ApiError):
    """The upload ended before the whole file arrived (the client went away, or its body's
    deadline passed): what an import's job says, since no client is left to answer."""

    code, status = "import_incomplete", 400


class ImportBadBase64(ApiError):
    code, status = "import_bad_base64", 400


class ImportTooLarge(ApiError):
    code, status = "import_too_large", 413


class ImportNotFound(ApiError):
    code, status = "import_not_found", 404


class BadCredentials(ApiError):
    code, status = "bad_credentials", 401


class Unauthenticated(ApiError):
    code, status = "unauthenticated", 401


class BadOrigin(ApiError):
    code, status = "bad_origin", 403


class Forbidden(ApiError):
    code, status = "forbidden", 403


class WrongPassword(ApiError):
    """A password change whose current password is not right. Not 401: the request itself
    is signed in, and a page that hears 401 takes it for a sign-in that ended."""

    code, status = "wrong_password", 403


class RouteNotFound(ApiError):
    code, status = "not_found", 404


class QueueItemNotFound(ApiError):
    code, status = "queue_item_not_found", 404


class QueueItemChanged(ApiError):
    """A queued message kept being edited (through another replica) while it was started."""

    code, status = "queue_item_changed", 409


class AttachmentNotFound(ApiError):
    code, status = "attachment_not_found", 404


class RowNotFound(ApiError):
    """A row id (edit, regenerate, branch switch) not in the transcript shown."""

    code, status = "row_not_found", 404


class UserNotFound(ApiError):
    code, status = "user_not_found", 404


class TokenNotFound(ApiError):
    code, status = "token_not_found", 404


class MethodNotAllowed(ApiError):
    code, status = "method_not_allowed", 405


class SessionBusy(ApiError):
    code, status = "session_busy", 409


class SessionRotated(ApiError):
    code, status = "session_rotated", 409


class TranscriptChanged(ApiError):
    """A new message sent from a view of the transcript (`after_seq`) that rows were hidden
    from since (another tab switched branch, edited, regenerated or cut): the model would
    get a context the user never saw (contract invariant 1)."""

    code, status = "transcript_changed", 409


class UserExists(ApiError):
    code, status = "user_exists", 409


class NoPassword(ApiError):
    """A password change by a person who signs in through a proxy or an identity provider:
    there is no password here to change."""

    code, status = "no_password", 409


class RequestTimeout(ApiError):
    code, status = "request_timeout", 408


class HostNotAllowed(ApiError):
    code, status = "host_not_allowed", 421


class PayloadTooLarge(ApiError):
    code, status = "payload_too_large", 413


class RenderTooLarge(ApiError):
    code, status = "render_too_large", 413


class TooManyStreams(ApiError):
    code, status = "too_many_streams", 429


class RateLimited(ApiError):
    code, status = "rate_limited", 429


class InternalError(ApiError):
    code, status = "internal", 500


class ServerClosing(ApiError):
    code, status = "server_closing", 503


class SignInUnavailable(ApiError):
    code, status = "sign_in_unavailable", 503


class RenderBusy(ApiError):
    code, status = "render_busy", 503


class RenderUnavailable(ApiError):
    code, status = "render_unavailable", 503
