"""Layer: HTTP errors. Every error the API returns is a class of one family
(`tether.errors.ApiError`) carrying its code and status; the HTTP layer maps the family in one
place, so what a client gets is exactly what the class says, from every layer that raises."""

from __future__ import annotations

import tether.http.app  # noqa: F401 - loads every module that defines a member of the family
from tether import errors
from tether.errors import ApiError
from tether.log.errors import InvalidEvent, SessionNotFound, StorageError

from helpers import ServerProcess, new_session


def family() -> list[type[ApiError]]:
    found, pending = [], [ApiError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_each_code_belongs_to_one_class_with_an_error_status() -> None:
    owners: dict[str, type[ApiError]] = {}
    for cls in family()[1:]:
        assert 400 <= cls.status <= 599, cls
        if "code" in vars(cls):  # InvalidEvent is an InvalidRequest: it shares the code
            assert cls.code not in owners, (cls, owners.get(cls.code))
            owners[cls.code] = cls
    assert {SessionNotFound, StorageError} <= set(owners.values())
    assert issubclass(InvalidEvent, errors.InvalidRequest)
    assert (SessionNotFound.status, StorageError.status, InvalidEvent.status) == (404, 503, 400)


def test_the_server_answers_each_refusal_with_its_class(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        sid = new_session(client)
        long = "x" * 200_001
        huge = b"{" + b" " * (31 * 1024 * 1024) + b"}"
        refusals = [
            (errors.InvalidRequest, client.post("/api/chat/cancel", json={})),
            (errors.InvalidRequest, client.post("/api/chat/start", json={"session_id": sid})),
            (SessionNotFound, client.get("/api/session", params={"session_id": "s_none"})),
            (errors.AttachmentNotFound, client.get("/api/attachments/a_none")),
            (errors.QueueItemNotFound, client.delete("/api/chat/queue?queue_id=q_none")),
            (errors.RouteNotFound, client.get("/api/no-such-route")),
            (errors.MethodNotAllowed, client.put("/api/sessions")),
            (
                errors.PayloadTooLarge,  # from the run intake
                client.post("/api/chat/start", json={"session_id": sid, "message": long}),
            ),
            (errors.PayloadTooLarge, client.post("/api/sessions", content=huge)),  # middleware
            (
                errors.BadOrigin,
                client.post("/api/sessions", json={}, headers={"Origin": "https://evil.example"}),
            ),
        ]
        for cls, response in refusals:
            body = response.json()
            assert (response.status_code, body["code"]) == (cls.status, cls.code), body
            assert body["message"].strip(), body
