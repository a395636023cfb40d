"""Built-in read-only workspace tools: list, read and search files under one directory.

They exist so a model can look at the project the user points Tether at (`--workspace`)
without being able to change anything or see anything outside it. Every path is resolved
(`..` and symlinks included) and refused unless it lands inside the workspace root. Failures
come back as `(message, True)` tool results for the model to read, never as exceptions, so a
bad call costs one tool round instead of the whole run.

Only regular files are read. Opening a FIFO blocks until something writes to it, and a
device may never stop answering: issue 11 found a named pipe in the workspace hanging a
worker thread per call, then the tools of other sessions, then shutdown. Every file is
opened with `O_NONBLOCK | O_NOFOLLOW` (so neither a FIFO nor a symlink swapped in after the
path was resolved is followed) and checked with `fstat` on the open descriptor before any
read; anything that is not a regular file is a tool error naming what it is. Reads are capped
in bytes, a search also in time (`MAX_SEARCH_SECONDS`), and `ToolRunner` runs each call on
its own daemon thread, at most `MAX_CONCURRENT_TOOLS` at once, with a deadline
(`TOOL_TIMEOUT_SECONDS`), so a call stuck in the kernel (a hung network mount) can neither
hold up the run, nor the threads the rest of the server uses, nor the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MAX_LIST_ENTRIES = 500
DEFAULT_READ_CHARS = 20_000
MAX_READ_CHARS = 200_000
MAX_SEARCH_HITS = 200
MAX_SEARCH_FILES = 20_000
MAX_SEARCH_FILE_BYTES = 2 * 1024 * 1024
MAX_HIT_LINE_CHARS = 300
MAX_SEARCH_SECONDS = 10.0
TOOL_TIMEOUT_SECONDS = 30.0
MAX_CONCURRENT_TOOLS = 4
_SNIFF_BYTES = 8192
_OPEN_FLAGS = (
    os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_NOCTTY", 0) | os.O_CLOEXEC
)
# Directories a search walks past: version control and dependency caches drown real hits.
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        "__pycache__",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
    }
)

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the entries of a directory in the workspace (directories end "
            "with '/'). Paths are relative to the workspace root.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "Directory to list; '.' is the workspace root.",
                        "default": ".",
                    },
                },
                "required": [],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a UTF-8 text file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "File path relative to the workspace root.",
                    },
                    "max_chars": {
                        "type": "integer",
                        "description": "Return at most this many characters.",
                        "default": DEFAULT_READ_CHARS,
                    },
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "description": "Case-insensitive substring search over the text files under a "
            "workspace directory. Returns 'path:line: text' for each match.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {
                        "type": "string",
                        "description": "Text to look for (not a regular expression).",
                    },
                    "path": {
                        "type": "string",
                        "description": "Directory or file to search; '.' is the workspace root.",
                        "default": ".",
                    },
                },
                "required": ["pattern"],
            },
        },
    },
]

TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOL_SCHEMAS)


class ToolError(Exception):
    """A refusal or failure whose message is the tool result the model sees."""


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _not_regular(path: str, mode: int) -> ToolError:
    return ToolError(
        f"{path} is {_kind(mode)}, not a regular file; the workspace tools read regular files only."
    )


def read_regular(target: Path, shown: str, limit: int) -> tuple[bytes, int]:
    """At most `limit` bytes of the regular file `target` and its size. Never blocks on a
    FIFO or device: opened non-blocking, without following a final symlink, and checked on
    the descriptor itself (no window between the check and the read)."""
    try:
        fd = os.open(target, _OPEN_FLAGS)
    except OSError as exc:
        try:
            mode = os.lstat(target).st_mode  # a socket cannot be opened at all (ENXIO)
        except OSError:
            raise exc from None
        if not stat.S_ISREG(mode):
            raise _not_regular(shown, mode) from None
        raise
    with open(fd, "rb", closefd=True) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(shown, info.st_mode)
        return handle.read(limit), info.st_size


def _str_arg(args: dict[str, Any], key: str, default: str | None = None) -> str:
    value = args.get(key, default)
    if value is None:
        raise ToolError(f"Missing required argument {key!r}.")
    if not isinstance(value, str):
        raise ToolError(f"Argument {key!r} must be a string.")
    return value


class WorkspaceTools:
    """The tools bound to one workspace root; `run_tool` is safe to call from a thread."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.schemas = TOOL_SCHEMAS
        self._tools: dict[str, Callable[[dict[str, Any]], str]] = {
            "list_files": self._list_files,
            "read_file": self._read_file,
            "search_files": self._search_files,
        }

    def run_tool(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """`(result, is_error)`. Never raises for bad input or file system trouble."""
        tool = self._tools.get(name)
        if tool is None:
            return (
                f"Unknown tool {name!r}. Available tools: {', '.join(sorted(self._tools))}.",
                True,
            )
        if not isinstance(args, dict):
            return "Tool arguments must be a JSON object.", True
        try:
            return tool(args), False
        except ToolError as exc:
            return str(exc), True
        except OSError as exc:
            return f"{name} failed: {exc.strerror or exc}", True

    # ---- confinement -------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real path `path` names, if it is the root or inside it; ToolError otherwise."""
        if "\x00" in path:
            raise ToolError("The path contains a NUL character.")
        target = (self.root / path).resolve()
        if target != self.root and not target.is_relative_to(self.root):
            raise ToolError(
                f"Access denied: {path!r} is outside the workspace. Only paths "
                "inside the workspace can be used."
            )
        return target

    def _display(self, target: Path) -> str:
        rel = target.relative_to(self.root).as_posix()
        return rel or "."

    # ---- tools -------------------------------------------------------------------------------

    def _list_files(self, args: dict[str, Any]) -> str:
        path = _str_arg(args, "path", ".") or "."
        target = self.resolve(path)
        if not target.exists():
            raise ToolError(f"No such directory: {path}")
        if not target.is_dir():
            raise ToolError(f"{path} is a file, not a directory; use read_file to read it.")
        entries = []
        with os.scandir(target) as it:
            for entry in it:
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                entries.append(entry.name + "/" if is_dir else entry.name)
        entries.sort()
        if not entries:
            return f"{self._display(target)} is empty."
        shown = entries[:MAX_LIST_ENTRIES]
        out = "\n".join(shown)
        if len(entries) > len(shown):
            out += f"\n... ({len(entries) - len(shown)} more entries not shown)"
        return out

    def _read_file(self, args: dict[str, Any]) -> str:
        path = _str_arg(args, "path")
        max_chars = args.get("max_chars", DEFAULT_READ_CHARS)
        if max_chars is None:
            max_chars = DEFAULT_READ_CHARS
        if isinstance(max_chars, bool) or not isinstance(max_chars, int | float):
            raise ToolError("Argument 'max_chars' must be an integer.")
        max_chars = max(1, min(int(max_chars), MAX_READ_CHARS))
        target = self.resolve(path)
        if not target.exists():
            raise ToolError(f"No such file: {path}")
        if target.is_dir():
            raise ToolError(f"{path} is a directory; use list_files to see what it holds.")
        # UTF-8 takes at most 4 bytes a character: this many bytes always suffice.
        data, size = read_regular(target, path, max_chars * 4 + 4)
        if _is_binary(data[:_SNIFF_BYTES]):
            raise ToolError(
                f"{path} looks like a binary file ({size:,} bytes); read_file only "
                "reads text files."
            )
        text = data.decode("utf-8", errors="replace")
        if len(text) > max_chars or len(data) < size:
            text = text[:max_chars]
            text += (
                f"\n... (truncated: showed the first {len(text):,} characters of a "
                f"{size:,}-byte file)"
            )
        return text

    def _search_files(self, args: dict[str, Any]) -> str:
        pattern = _str_arg(args, "pattern")
        if not pattern:
            raise ToolError("Argument 'pattern' must not be empty.")
        path = _str_arg(args, "path", ".") or "."
        target = self.resolve(path)
        if not target.exists():
            raise ToolError(f"No such file or directory: {path}")
        mode = target.stat().st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise _not_regular(path, mode)
        needle = pattern.casefold()
        hits: list[str] = []
        deadline = time.monotonic() + MAX_SEARCH_SECONDS
        for scanned, file in enumerate(self._walk(target), 1):
            if scanned > MAX_SEARCH_FILES:
                hits.append(f"... (stopped after scanning {MAX_SEARCH_FILES:,} files)")
                break
            if time.monotonic() > deadline:
                hits.append(f"... (stopped after {MAX_SEARCH_SECONDS:g} s of searching)")
                break
            if self._search_one(file, needle, hits):
                hits.append(f"... (stopped after {MAX_SEARCH_HITS} matches)")
                break
        if not hits:
            return f"No matches for {pattern!r} in {self._display(target)}."
        return "\n".join(hits)

    def _walk(self, target: Path) -> Iterator[Path]:
        """Regular files under `target`, sorted, never leaving the root (links included)."""
        if target.is_file():
            yield target
            return
        for dirpath, dirnames, filenames in os.walk(target):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                file = Path(dirpath) / name
                try:
                    real = file.resolve()
                except OSError:
                    continue
                if real.is_relative_to(self.root) and real.is_file():
                    yield file

    def _search_one(self, file: Path, needle: str, hits: list[str]) -> bool:
        """Append the matches in `file` to `hits`; True once the hit limit is reached."""
        try:
            real = file.resolve()  # inside the root: _walk checked; a later swap is refused
            data, size = read_regular(real, str(file), MAX_SEARCH_FILE_BYTES + 1)
        except (OSError, ToolError):  # swapped for something else since the walk saw it
            return False
        if size > MAX_SEARCH_FILE_BYTES or len(data) > MAX_SEARCH_FILE_BYTES:
            return False
        if _is_binary(data[:_SNIFF_BYTES]):
            return False
        rel = file.relative_to(self.root).as_posix()
        for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if needle in line.casefold():
                shown = line.strip()
                if len(shown) > MAX_HIT_LINE_CHARS:
                    shown = shown[:MAX_HIT_LINE_CHARS] + "..."
                hits.append(f"{rel}:{lineno}: {shown}")
                if len(hits) >= MAX_SEARCH_HITS:
                    return True
        return False


class ToolRunner:
    """Runs tool calls off the event loop on daemon threads, at most MAX_CONCURRENT_TOOLS at
    once, each with a deadline. Not the shared thread pool: a call stuck in the kernel would
    hold one of its threads for good (attachment starts and log reads queue behind them), and
    the pool's threads are joined at exit, so SIGTERM would wait for it forever."""

    def __init__(self, tools: WorkspaceTools, timeout: float = TOOL_TIMEOUT_SECONDS) -> None:
        self.tools = tools
        self.timeout = timeout
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_TOOLS)

    async def run(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        if not self._slots.acquire(blocking=False):
            return (
                f"{name} could not run: {MAX_CONCURRENT_TOOLS} tool calls are still running "
                "(one may be stuck on a slow file system). Try again later.",
                True,
            )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[str, bool]] = loop.create_future()

        def deliver(result: tuple[str, bool]) -> None:
            if not done.done():
                done.set_result(result)

        def work() -> None:
            try:
                result = self.tools.run_tool(name, args)
            except Exception as exc:  # a tool bug must not end the run
                result = (f"{name} failed unexpectedly: {exc}", True)
            finally:
                self._slots.release()
            with contextlib.suppress(RuntimeError):  # the loop is gone: shutting down
                loop.call_soon_threadsafe(deliver, result)

        threading.Thread(target=work, name=f"tether-tool-{name}", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(done), self.timeout)
        except TimeoutError:
            return (f"{name} did not finish within {self.timeout:g} s and was abandoned.", True)
