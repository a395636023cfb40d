"""Request bodies and query parameters, validated strictly: a wrong type is a 400, never a
silent coercion. Unknown fields are ignored so newer clients keep working."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from tether.events import ID_PATTERN

Id = Annotated[StrictStr, Field(pattern=ID_PATTERN)]
SessionIdQuery = Annotated[str, Query(pattern=ID_PATTERN, description="A session id")]
QueueIdQuery = Annotated[str, Query(pattern=ID_PATTERN, description="A queued message id")]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class CreateSession(Body):
    title: StrictStr | None = None


class PatchSession(Body):
    session_id: Id
    title: StrictStr | None = None
    pinned: StrictBool | None = None
    archived: StrictBool | None = None


class TruncateSession(Body):
    session_id: Id
    keep_count: Annotated[StrictInt, Field(ge=0, le=10_000_000)]


class AttachmentUpload(Body):
    name: Annotated[StrictStr, Field(min_length=1, max_length=255)]
    mime: Annotated[StrictStr, Field(min_length=1, max_length=255)]
    data_base64: StrictStr


class StartTurn(Body):
    session_id: Id
    message: StrictStr
    attachments: list[AttachmentUpload] = []
    model: Annotated[StrictStr, Field(min_length=1, max_length=200)] | None = None


class CancelRun(Body):
    stream_id: Id | None = None
    session_id: Id | None = None


class SteerRun(Body):
    stream_id: Id
    text: StrictStr


class QueueMessage(Body):
    session_id: Id
    message: StrictStr
    attachments: list[AttachmentUpload] = []


class EditQueued(Body):
    text: StrictStr
