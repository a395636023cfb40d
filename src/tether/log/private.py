"""The data directory holds every conversation, so it is private to its owner whatever the
umask: the directory 0700, the files in it 0600. The directory's mode is what keeps other
local users out (without search permission on it nothing inside can be opened); the files'
modes keep that true if the directory is ever opened up or copied elsewhere.

An existing directory or database with looser modes is tightened, with a warning in the log:
a directory someone made world-readable by hand would otherwise go on leaking silently.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger("tether")

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create `path` (its parents as usual) mode 0700, or tighten it if it exists."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    tighten(path, DIR_MODE)


def private_file(path: Path) -> None:
    """Create an empty `path` mode 0600 unless it exists, then tighten it: SQLite creates a
    database as 0644 under umask 022, and gives its -wal and -shm files the database's mode."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        tighten(path, FILE_MODE)
    except OSError:
        pass  # a directory that cannot be written: opening the database reports it


def tighten(path: Path, mode: int) -> None:
    """Remove every permission beyond `mode`; a path that cannot be changed is logged."""
    current = stat.S_IMODE(path.stat().st_mode)
    if not current & ~mode:
        return
    try:
        os.chmod(path, current & mode)
    except OSError as exc:
        log.warning(
            "%s is readable by other users (mode %o) and could not be restricted: %s",
            path,
            current,
            exc,
        )
        return
    log.warning(
        "%s was open to other users (mode %o); restricted it to its owner (%o)",
        path,
        current,
        current & mode,
    )


def write_whole(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file (0600, a name of its own: two writers may write one
    path at once) beside `path`, fsync it, rename it over `path` and fsync the directory: a
    crash leaves the old content or the new, never half of either, and a failed write (a full
    disk) leaves no temporary file behind."""
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
