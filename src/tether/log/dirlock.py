"""One server per SQLite data directory: `tether serve` holds an exclusive `flock` on
`<data_dir>/tether.lock` for as long as it runs, and a second process started on the same
directory is refused with a message naming it. The kernel drops the lock when the process
ends, however it ends (`kill -9` included), so a stale lock file never blocks a restart.

SQLite itself would let two processes share the file, but each keeps its own seq counters,
index and live subscribers in memory: a second server would hand out seqs the first also
hands out (refused by the UNIQUE constraint, as errors) and neither would see the other's
events live. Several replicas are what `--database-url` (PostgreSQL) is for.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from tether.log.errors import StorageError
from tether.log.private import FILE_MODE, private_dir

LOCK_NAME = "tether.lock"


def lock_data_dir(data_dir: Path) -> IO[str] | None:
    """Take the directory's lock for this process; keep the returned file open (closing it
    releases the lock). StorageError when another process holds it; None when the directory
    cannot be written (the database's own checks then say why, log/sqlite.py)."""
    path = data_dir / LOCK_NAME
    try:
        private_dir(data_dir)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    except OSError:
        return None  # a directory that cannot be written: opening the database reports it
    handle = os.fdopen(fd, "r+", encoding="ascii")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = handle.read().strip()
        handle.close()
        raise StorageError(
            f"Another Tether server{f' (process {holder})' if holder else ''} is already "
            f"using the data directory {data_dir}: one SQLite data directory serves one "
            "process. Nothing was changed. Stop the other server, give this one another "
            "--data-dir, or run several replicas on PostgreSQL with --database-url "
            "(docs/operations.md)."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
