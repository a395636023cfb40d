"""Errors the log raises; the HTTP layer maps them to statuses and stable codes."""


class LogError(Exception):
    pass


class SessionNotFound(LogError):
    def __init__(self, session_id: str):
        super().__init__(f"no session {session_id!r}")
        self.session_id = session_id


class SessionExists(LogError):
    pass


class StreamClosed(LogError):
    """The stream already has its `run.finished`: a late or duplicate append is refused."""

    def __init__(self, stream_id: str):
        super().__init__(f"stream {stream_id!r} already finished")
        self.stream_id = stream_id


class StorageError(LogError):
    """The database could not be opened or written (corrupt file, disk full, read-only)."""


class StorageReadOnly(StorageError):
    """The data directory (or the database in it) cannot be written at all: refused at start."""


class InvalidEvent(LogError):
    """The event's data cannot be stored (not JSON, or text UTF-8 cannot encode)."""
