"""Tether's own export format (docs/api.md §12): a session's durable events plus the bytes of
its attachments, versioned.

The log is the source of truth and every view a projection of it, so the export is the log:
importing it folds into the same visible transcript, branches, model context and row, with no
case per feature. What an import changes, and why:

- The session gets a new id, and so do the ids the log looks up across sessions (streams,
  turns, queue items, attachments): importing into the server the export came from must not
  collide with the original (a stream id is fenced server-wide once it has finished). They
  are replaced wherever a field names one: a field called `id`, `*_id`, `*_ids` or `*_of`
  (`edit_of`, `row_id` of `branch.switched`), never in text.
- Lineage (`parent_session_id`, `continuation_session_id`) points at the imported copy of
  that session when the same file holds it and this import makes it (`plan.linked_only_to`),
  and at nothing otherwise; so does a link to the
  agent's own session (`agent_session_id`): a copy does not follow the agent's history.
- `session.created` records `imported: {source, key, origin}`: the key makes importing the
  same file twice find the first import instead of making a copy.
- A run the export caught while it was running ends `interrupted` (maintenance: the row does
  not look newer, invariant 4), as a restart would end it.

Every event is checked by type and then folded by the real projections (row, transcript,
model context) before anything is written: a file that would not fold is refused, naming the
event.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tether import events as ev
from tether.events import ID_PATTERN, Event, new_id
from tether.log.store import Draft
from tether.projections.sidebar import fold_row
from tether.projections.transcript import TranscriptFold
from tether.sessions.defaults import MODEL_MAX_CHARS, SYSTEM_PROMPT_MAX_CHARS
from tether.sessions.service import clean_title
from tether.sessions.transfer.plan import (
    HALF_PAIR,
    MAX_EVENTS_PER_SESSION,
    Refusal,
    SessionPlan,
    Upload,
    half_pair_at,
    invalid,
    join,
    not_future,
    path_of,
)
from tether.visible_text import shown_file_name

FORMAT = "tether.session"
VERSION = 1

KNOWN_TYPES = frozenset(
    value
    for name, value in vars(ev).items()
    if name.isupper() and isinstance(value, str) and "." in value and " " not in value
)
Time = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # and not later than now: not_future
Id = Annotated[str, Field(pattern=ID_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class EventIn(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid")
    seq: int
    type: str
    at: Time
    session_id: str | None = None
    stream_id: Id | None = None
    turn_id: Id | None = None
    data: dict[str, Any]


class AttachmentIn(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid")
    id: Id
    name: Annotated[str, Field(min_length=1, max_length=255)]
    mime: Annotated[str, Field(max_length=255)]
    size: Annotated[int, Field(ge=0)]
    data_base64: str


class MissingIn(_Strict):
    """An attachment whose bytes the exporting server no longer had."""

    model_config = ConfigDict(strict=True, extra="forbid")
    id: Id
    name: Annotated[str, Field(min_length=1, max_length=255)]
    mime: str
    size: Annotated[int, Field(ge=0)]


class SessionIn(_Strict):
    model_config = ConfigDict(strict=True, extra="ignore")
    format: Literal["tether.session"]
    version: int
    session_id: str | None = None  # the copy's `imported.origin`
    events: Annotated[list[EventIn], Field(min_length=1, max_length=MAX_EVENTS_PER_SESSION)]
    attachments: list[AttachmentIn] = []
    missing_attachments: list[MissingIn] = []


class _Ref(_Strict):
    id: Id
    name: str
    mime: str
    size: int


class _Created(_Strict):
    title: str | None = None


class _Updated(_Strict):
    """What `PATCH /api/session` would accept (docs/api.md §3): a session imported holds
    no model id or system prompt the server would refuse it."""

    title: str | None = None
    pinned: bool = False
    archived: bool = False
    model: Annotated[str, Field(max_length=MODEL_MAX_CHARS, pattern=r"\S")] | None = None
    system_prompt: Annotated[str, Field(max_length=SYSTEM_PROMPT_MAX_CHARS)] | None = None


class _Submitted(_Strict):
    turn_id: Id
    stream_id: Id
    text: str
    attachments: list[_Ref] = []
    submitted_at: Time | None = None


class _Queued(_Strict):
    queue_id: Id
    text: str = ""
    attachments: list[_Ref] = []


class _Delta(_Strict):
    item_id: str | int
    text: str


class _Usage(_Strict):
    """Token counts the context meter shows (`used / window`): none is negative."""

    prompt_tokens: Annotated[int, Field(ge=0)]
    completion_tokens: Annotated[int, Field(ge=0)]


class _Finished(_Strict):
    state: Literal[ev.RUN_STATES] = "completed"  # type: ignore[valid-type]
    usage: _Usage | None = None


# The fields the folds and the page read as a given type; everything else is checked by
# folding it.
_DATA: dict[str, TypeAdapter[Any]] = {
    ev.SESSION_CREATED: TypeAdapter(_Created),
    ev.SESSION_UPDATED: TypeAdapter(_Updated),
    ev.TURN_SUBMITTED: TypeAdapter(_Submitted),
    ev.QUEUE_ADDED: TypeAdapter(_Queued),
    ev.TEXT_DELTA: TypeAdapter(_Delta),
    ev.REASONING_DELTA: TypeAdapter(_Delta),
    ev.RUN_FINISHED: TypeAdapter(_Finished),
}
# Keys whose values name something the log looks up across sessions.
_REKEYED = ("stream_id", "turn_id", "queue_id", "boundary_turn_id")

INTERRUPTED_REASON = "the export was made while this run was going on"


def export_entry(
    events: list[Event],
    attachments: list[dict[str, Any]],
    at: float,
    missing: list[dict[str, Any]] | None = None,
) -> dict:
    """One session in Tether's format. `attachments`: `{id, name, mime, size, data}`;
    `missing`: `{id, name, mime, size}` of those whose bytes the server no longer has
    (`missing_attachments`, only when there are some)."""
    entry = {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": at,
        "session_id": events[0].session_id if events else None,
        "events": [{k: v for k, v in e.envelope().items() if k != "session_id"} for e in events],
        "attachments": [
            {
                "id": a["id"],
                "name": a["name"],
                "mime": a["mime"],
                "size": a["size"],
                "data_base64": base64.b64encode(a["data"]).decode("ascii"),
            }
            for a in attachments
        ],
    }
    if missing:
        entry["missing_attachments"] = missing
    return entry


def looks_like(value: Any) -> bool:
    return isinstance(value, dict) and value.get("format") == FORMAT


def content_key(entry: dict[str, Any]) -> str:
    """The same session exported the same way gives the same key, whenever it was exported."""
    body = {"events": entry.get("events"), "attachments": entry.get("attachments")}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "tether:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def plan_sessions(
    entries: list[Any], progress: Callable[[int], None], where: Callable[[int], str]
) -> list[SessionPlan]:
    """Check every entry and make its plan; lineage is resolved across the whole file."""
    parsed = [_parse(entry, where(i)) for i, entry in enumerate(entries)]
    new_ids: dict[str, str] = {}
    for origin, _ in parsed:
        if origin:
            new_ids.setdefault(origin, new_id("s"))
    plans, used = [], set()
    for i, ((origin, entry), raw) in enumerate(zip(parsed, entries, strict=True)):
        sid = new_ids.get(origin or "")
        if sid is None or sid in used:  # the same session twice (two exports joined)
            sid = new_id("s")
        used.add(sid)
        plans.append(_plan(sid, entry, raw, new_ids, where(i)))
        progress(i + 1)
    return plans


def _parse(raw: Any, where: str) -> tuple[str | None, SessionIn]:
    version = raw.get("version") if isinstance(raw, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version != VERSION:
        later = "Import it with a newer Tether." if version > VERSION else "No Tether writes it."
        raise Refusal(
            "import_unsupported_version",
            f"{where or 'The file'}: this is version {version} of Tether's export; this "
            f"server reads version {VERSION}. {later}",
            path=where,
        )
    try:
        entry = SessionIn.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise invalid(path_of(first["loc"], where), first["msg"]) from None
    origin = raw.get("session_id")
    return (origin if isinstance(origin, str) else None), entry


def _plan(
    sid: str, entry: SessionIn, raw: dict[str, Any], sessions: dict[str, str], where: str
) -> SessionPlan:
    uploads, attachment_ids = _uploads(entry.attachments, where)
    ids: dict[str, str] = dict(attachment_ids)
    missing = _missing(entry.missing_attachments, ids, where)
    for i, event in enumerate(entry.events):
        if event.seq != i + 1:
            raise invalid(join(where, f"events[{i}].seq"), f"is {event.seq}; expected {i + 1}")
        if event.type not in KNOWN_TYPES:
            raise invalid(join(where, f"events[{i}].type"), f"{event.type!r} is not a Tether event")
        if (i == 0) != (event.type == ev.SESSION_CREATED):
            raise invalid(join(where, f"events[{i}].type"), "a log starts with one session.created")
        check = _DATA.get(event.type)
        if check is not None:
            try:
                check.validate_python(event.data)
            except ValidationError as exc:
                first = exc.errors()[0]
                path = path_of(first["loc"], where, f"events[{i}].data")
                raise invalid(path, first["msg"]) from None
        bad = half_pair_at(event.data)
        if bad is not None:
            raise invalid(join(where, f"events[{i}].data{bad}"), HALF_PAIR)
        _titles(event, join(where, f"events[{i}].data.title"))
        not_future(event.at, join(where, f"events[{i}].at"))
        if event.type == ev.TURN_SUBMITTED:  # the time the transcript shows the message at
            not_future(
                event.data.get("submitted_at"), join(where, f"events[{i}].data.submitted_at")
            )
        for value in (event.stream_id, event.turn_id, *(event.data.get(k) for k in _REKEYED)):
            if isinstance(value, str) and value not in ids:
                ids[value] = new_id(value.partition("_")[0] if "_" in value else "x")
    drafts = [_draft(event, ids, sessions) for event in entry.events if _kept(event, sessions)]
    drafts[0] = Draft(
        ev.SESSION_CREATED,
        {
            **drafts[0].data,
            "imported": {
                "source": "tether",
                "key": content_key(raw),
                "origin": raw.get("session_id"),
            },
        },
        at=drafts[0].at,
    )
    _refs_known(drafts, {upload.id: upload for upload in uploads}, missing, where)
    drafts += _close_open_runs(drafts)
    _fold(sid, drafts, where)
    return SessionPlan(content_key(raw), "tether", drafts, uploads, session_id=sid)


def _kept(event: EventIn, sessions: dict[str, str]) -> bool:
    """Not a rotation into a session the file does not hold: the copy is not rotated into
    nothing (it would refuse new turns, pointing at no continuation)."""
    link = event.data.get("continuation_session_id")
    return not (event.type == ev.SESSION_ROTATED and isinstance(link, str) and link not in sessions)


def _titles(event: EventIn, path: str) -> None:
    """A title is checked and cleaned as PATCH /api/session does it, and the copy holds the
    cleaned one: a file (an export of a log written before titles were cleaned, or a crafted
    one) may carry bidi overrides or zero-width characters in it."""
    title = event.data.get("title")
    if event.type in (ev.SESSION_CREATED, ev.SESSION_UPDATED) and title is not None:
        try:
            event.data["title"] = clean_title(title)
        except Exception as exc:  # InvalidRequest: the same rule as PATCH /api/session
            raise invalid(path, str(exc)) from None


def _uploads(items: list[AttachmentIn], where: str) -> tuple[list[Upload], dict[str, str]]:
    uploads, ids = [], {}
    for i, item in enumerate(items):
        path = join(where, f"attachments[{i}]")
        try:
            data = base64.b64decode(item.data_base64, validate=True)
        except (binascii.Error, ValueError):
            raise Refusal(
                "import_bad_base64", f"{path}.data_base64 is not valid base64.", path=path
            ) from None
        if len(data) != item.size:
            raise invalid(f"{path}.size", f"is {item.size}; the data holds {len(data)} bytes")
        name = _file_name(item.name, f"{path}.name")
        if item.id in ids:
            raise invalid(f"{path}.id", "appears twice")
        ids[item.id] = new_id("a")
        uploads.append(Upload(ids[item.id], name, item.mime, data))
    return uploads, ids


def _missing(items: list[MissingIn], ids: dict[str, str], where: str) -> dict[str, MissingIn]:
    """The attachments the file says it has no bytes for, by their new ids (added to `ids`):
    the copy refers to them as the original did, and has no bytes either."""
    out = {}
    for i, item in enumerate(items):
        if item.id in ids:
            raise invalid(join(where, f"missing_attachments[{i}].id"), "appears twice")
        name = _file_name(item.name, join(where, f"missing_attachments[{i}].name"))
        ids[item.id] = new_id("a")
        out[ids[item.id]] = item.model_copy(update={"name": name})
    return out


def _file_name(name: str, path: str) -> str:
    """A file name without a path (as runs/intake.py takes one), held in the copy as it is
    shown and saved (`shown_file_name`). One that shows nothing once cleaned is `attachment`,
    not refused: intake refuses it now, but a log written before names were cleaned may hold
    one, and its own export must import back."""
    name = shown_file_name(name)
    if "/" in name or "\\" in name:
        raise invalid(path, "is not a plain file name")
    return name


def _rekey(value: Any, ids: dict[str, str], sessions: dict[str, str], key: str = "") -> Any:
    if isinstance(value, dict):
        return {
            k: _rekey(v, ids, sessions, k)
            for k, v in value.items()
            # a link to a session the file does not hold is left out, not made null: the
            # events' definitions have such links as strings or not at all
            if not (isinstance(v, str) and k.endswith("session_id") and v not in sessions)
        }
    if isinstance(value, list):
        return [_rekey(v, ids, sessions, key) for v in value]
    if isinstance(value, str) and key.endswith("session_id"):
        return sessions.get(value)  # a session the file does not hold: nothing
    if isinstance(value, str) and (key == "id" or key.endswith(("_id", "_ids", "_of"))):
        return ids.get(value, value)  # a row, stream, turn, queue item or attachment
    return value


def _draft(event: EventIn, ids: dict[str, str], sessions: dict[str, str]) -> Draft:
    return Draft(
        event.type,
        _rekey(event.data, ids, sessions),
        stream_id=ids[event.stream_id] if event.stream_id else None,
        turn_id=ids[event.turn_id] if event.turn_id else None,
        at=event.at,
    )


def _refs_known(
    drafts: list[Draft], uploads: dict[str, Upload], missing: dict[str, MissingIn], where: str
) -> None:
    """Every attachment an event refers to is in the file, as the file has it: a reference
    to bytes the file does not carry would otherwise name an upload of another session, and
    the reference's name, type and size are what the server keeps and shows (and exports
    again), so they must be the bytes' own. And every attachment of the file is referred to:
    bytes no event names would be stored with no row to show them or to release them when
    the session is deleted. A reference to one of the file's `missing_attachments` is kept
    as it is there, with no bytes."""
    named: set[str] = set()
    for i, draft in enumerate(drafts):
        if draft.type not in (ev.TURN_SUBMITTED, ev.QUEUE_ADDED):
            continue
        for j, ref in enumerate(draft.data.get("attachments") or []):
            path = join(where, f"events[{i}].data.attachments[{j}]")
            upload, gone = uploads.get(ref["id"]), missing.get(ref["id"])
            if upload is not None:
                own = {"name": upload.name, "mime": upload.mime, "size": len(upload.data)}
            elif gone is not None:
                own = {"name": gone.name, "mime": gone.mime, "size": gone.size}
            else:
                raise invalid(f"{path}.id", "names an attachment the file does not hold")
            if isinstance(ref["name"], str):  # compared, and kept, as the attachment's is
                ref["name"] = shown_file_name(ref["name"])
            for key, value in own.items():
                if ref[key] != value:
                    said = f"is {ref[key]!r}; the attachment's is {value!r}"
                    raise invalid(f"{path}.{key}", said)
            named.add(ref["id"])
    for field, held in (("attachments", uploads), ("missing_attachments", missing)):
        for i, attachment_id in enumerate(held):
            if attachment_id not in named:
                raise invalid(join(where, f"{field}[{i}].id"), "no event refers to it")


def _close_open_runs(drafts: list[Draft]) -> list[Draft]:
    opened: dict[str, str | None] = {}
    for draft in drafts:
        if draft.type == ev.TURN_SUBMITTED and draft.stream_id:
            opened[draft.stream_id] = draft.turn_id
        elif draft.type == ev.RUN_FINISHED and draft.stream_id:
            opened.pop(draft.stream_id, None)
    last = drafts[-1].at
    return [
        Draft(
            ev.RUN_FINISHED,
            {
                "stream_id": stream,
                "turn_id": turn,
                "state": "interrupted",
                "reason": INTERRUPTED_REASON,
                "maintenance": True,
            },
            stream_id=stream,
            turn_id=turn,
            at=last,
        )
        for stream, turn in opened.items()
    ]


def fold_check(sid: str, drafts: list[Draft], where: str) -> None:
    """Fold the events the way the server will (row, transcript, model context): an event
    that its type's definition does not describe, or that would not fold, is refused here,
    before anything is written."""
    row: dict[str, Any] | None = None
    transcript = TranscriptFold()
    for seq, draft in enumerate(drafts, start=1):
        try:
            ev.VOCABULARY.check(draft.type, draft.data)
        except ev.PayloadMismatch as exc:
            raise invalid(join(where, f"events[{seq - 1}]"), str(exc)) from None
        event = Event(
            sid, seq, draft.type, draft.at or 0.0, draft.data, draft.stream_id, draft.turn_id
        )
        path = join(where, f"events[{seq - 1}]")
        shown, generation = len(transcript.messages), row["transcript_generation"] if row else 0
        _check_sidebar_fields(draft, shown, generation, path)
        try:
            row = fold_row(row, event)
            transcript.apply(event)
        except Exception as exc:  # whatever the fold trips on, the file is what is wrong
            raise invalid(path, f"this {draft.type} event does not fold ({exc!r})") from None
        _check_counts(draft, row["message_count"], len(transcript.messages), path)
        # a time its data gives the row (a continuation's inherited one, an agent's turns)
        not_future(max(row["updated_at"], row["last_message_at"] or 0.0), f"{path}.data")
    try:
        transcript.view()
        transcript.context()
    except Exception as exc:
        raise invalid(where, f"the transcript does not fold ({exc!r})") from None


def _check_sidebar_fields(draft: Draft, shown: int, generation: int, path: str) -> None:
    """The sidebar row takes `keep_count` and `transcript_generation` as the event says: an
    imported one must be what the server writes there (a keep within the `shown` rows, the
    generation after the last), or the row would show a count the transcript does not have."""
    if draft.type not in (ev.TRANSCRIPT_TRUNCATED, ev.BRANCH_SWITCHED):
        return
    keep = draft.data.get("keep_count", 0)
    if draft.type == ev.TRANSCRIPT_TRUNCATED and not 0 <= keep <= shown:
        said = f"is {keep}; the transcript shows {shown} messages there"
        raise invalid(f"{path}.data.keep_count", said)
    if draft.data["transcript_generation"] != generation + 1:
        said = f"is {draft.data['transcript_generation']}; the one before it is {generation}"
        raise invalid(f"{path}.data.transcript_generation", said)


def _check_counts(draft: Draft, counted: int, shown: int, path: str) -> None:
    """The sidebar's `message_count` (`counted`) is the visible row count after every
    event, as it is for every log the server writes: a switch's `message_count`, a run that
    finishes twice or never started, a row id used twice would make it another number."""
    if draft.type == ev.BRANCH_SWITCHED and draft.data["message_count"] != shown:
        said = f"is {draft.data['message_count']}; the branch it shows has {shown} messages"
        raise invalid(f"{path}.data.message_count", said)
    if counted != shown:
        said = f"the sidebar would count {counted} messages where the transcript shows {shown}"
        raise invalid(path, said)


_fold = fold_check
