"""Errors the log raises. The ones a client can meet are in the API's error family
(`tether.errors`), with their code and status; the others stay inside the server."""

from tether.errors import (
    ApiError,
    InvalidRequest,
    QueueItemChanged,
    QueueItemNotFound,
    RowNotFound,
    SessionBusy,
    SessionRotated,
    TranscriptChanged,
)


class LogError(Exception):
    pass


class SessionNotFound(LogError, ApiError):
    code, status = "session_not_found", 404

    def __init__(self, session_id: str):
        super().__init__(f"no session {session_id!r}")
        self.session_id = session_id

    @property
    def message(self) -> str:
        return f"There is no session {self.session_id}."


class SessionExists(LogError):
    pass


class SessionOccupied(LogError, SessionBusy):
    """A new run's `turn.submitted`, an event that needs no run (a truncate, a branch
    switch) or a deletion that waits for one, while the session's log has an unfinished run
    (a backend shared by several processes decides in the database: log/postgres.py)."""

    def __init__(self, session_id: str, stream_id: str):
        SessionBusy.__init__(self, "A run is still using this session.", active_stream_id=stream_id)
        self.session_id, self.stream_id = session_id, stream_id


class TranscriptMoved(LogError, RowNotFound):
    """A truncate, an edit, a regenerate or a branch switch (`Draft.after_seq`) checked
    against a transcript another replica changed before it was written: the rows it names by
    position may be others by now, so it is refused like the stale tab it is (404
    `row_not_found`), never applied there (log/postgres.py)."""

    def __init__(self, session_id: str):
        RowNotFound.__init__(
            self,
            "The transcript changed meanwhile (another tab switched branch, edited or sent "
            "something); reload the session and try again.",
        )
        self.session_id = session_id


# What both refusals of a stale view say (runs/engine.py checks first, the database last).
TRANSCRIPT_CHANGED = (
    "The conversation changed in another tab or device (another branch is shown, or a "
    "message was edited, regenerated or cut) after this view of it; nothing was sent. "
    "Look at what is shown now and send again."
)


class SeenTranscriptChanged(LogError, TranscriptChanged):
    """A new turn sent from a view of the transcript (`Draft.shown_generation`) whose rows
    another replica hid (a truncate, a branch switch) after this one checked it: refused, 409
    `transcript_changed`, never appended after rows the user never saw (log/pg_batch.py)."""

    def __init__(self, session_id: str):
        TranscriptChanged.__init__(self, TRANSCRIPT_CHANGED)
        self.session_id = session_id


class SessionContinued(LogError, SessionRotated):
    """A new turn, a queued message or a change of the transcript (`admits_run`,
    `needs_no_run`, `queue.added`) for a session that has its `session.rotated`: a backend
    shared by several processes refuses it (log/postgres.py), for a replica that checked the
    session before another one rotated it. 409 `session_rotated` with the session it
    continues in (the callers name the newest of the lineage where they can)."""

    def __init__(self, session_id: str, continuation_session_id: str):
        SessionRotated.__init__(
            self,
            "This conversation continues in a newer session.",
            continuation_session_id=continuation_session_id,
        )
        self.session_id = session_id


class QueueItemGone(LogError, QueueItemNotFound):
    """An edit, a removal or a start of a queued message (`Draft.queued_since`) that another
    replica started or removed after this one read it: refused (404 `queue_item_not_found`),
    never applied to a message that already left the queue (log/postgres.py)."""

    def __init__(self, session_id: str, queue_id: str):
        QueueItemNotFound.__init__(
            self, "That queued message is not queued any more (it was sent or removed)."
        )
        self.session_id, self.queue_id = session_id, queue_id


class QueueItemEdited(LogError, QueueItemChanged):
    """A start of a queued message (its `queue.removed` "started", `Draft.queued_since`)
    edited through another replica after this one read its text: refused, so the old text is
    never sent while the edit is accepted; the engine reads it again and starts the new text
    (runs/engine.py), 409 `queue_item_changed` only when it keeps changing."""

    def __init__(self, session_id: str, queue_id: str):
        QueueItemChanged.__init__(
            self,
            "That queued message was edited (in another tab) while it was being sent; "
            "send it again.",
        )
        self.session_id, self.queue_id = session_id, queue_id


class CancelRequested(LogError):
    """The run already has its `run.cancel_requested`: a backend shared by several processes
    records Stop once per run, whichever replica it came through (log/postgres.py)."""

    def __init__(self, stream_id: str):
        super().__init__(f"stream {stream_id!r} already has its cancel request")
        self.stream_id = stream_id


class PromptAnswered(LogError):
    """The prompt already has its recorded answer (`approval.answered`, `clarify.answered`): a
    backend shared by several processes records one per prompt, whichever replica it came
    through (log/postgres.py)."""

    def __init__(self, stream_id: str, prompt: str):
        super().__init__(f"stream {stream_id!r}: {prompt} already has its answer")
        self.stream_id = stream_id


class StreamClosed(LogError):
    """The stream already has its `run.finished`: a late or duplicate append is refused."""

    def __init__(self, stream_id: str):
        super().__init__(f"stream {stream_id!r} already finished")
        self.stream_id = stream_id


class RunTakenOver(StreamClosed):
    """The run was taken over by another replica after this one's lease expired (the fence,
    log/pg_leases.py): this replica's late appends of it are refused, as a finished stream's."""

    def __init__(self, stream_id: str):
        LogError.__init__(self, f"stream {stream_id!r} was taken over by another replica")
        self.stream_id = stream_id


class StorageError(LogError, ApiError):
    """The database could not be opened or written (corrupt file, disk full, read-only)."""

    code, status = "storage_unavailable", 503

    @property
    def message(self) -> str:
        return f"Tether could not use its storage; nothing was changed. Details: {self}"


class NewerSchema(StorageError):
    """The database holds migrations this version does not know: a newer Tether made them.
    Refused at start, before anything is written (downgrades are not supported: this
    version would write rows without what they added and fold the sidebar its old way)."""

    def __init__(self, where: str, unknown: list[str]):
        where = f" {where}" if where else ""
        super().__init__(
            f"The Tether database{where} was migrated by a newer version of Tether "
            f"({', '.join(sorted(unknown))}, unknown to this one). Run that version or a "
            "newer one: downgrades are not supported. Nothing was changed."
        )


class StorageReadOnly(StorageError):
    """The data directory (or the database in it) cannot be written at all: refused at start."""


class InvalidEvent(LogError, InvalidRequest):
    """The event's data cannot be stored (not JSON, or text UTF-8 cannot encode)."""

    @property
    def message(self) -> str:
        return f"This cannot be stored: {self}"
