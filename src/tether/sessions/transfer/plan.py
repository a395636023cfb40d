"""What an import file becomes before anything is written: one `SessionPlan` per session,
checked in full (docs/api.md §12), and the limits a file must keep.

Plans cross a process boundary (the import worker, `transfer/worker.py`), so they are plain
picklable data, and a refusal travels as `Refusal(code, message, extra)` rather than as the
API error itself; `refusal_error` turns it back into the `tether.errors` class of that code.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from tether import errors
from tether import events as ev
from tether.log.store import Draft
from tether.visible_text import holds_half_pair, is_half_pair

# Nesting deeper than this is refused (`import_too_deep`): a Tether export nests about 8 deep
# (tool arguments a little more), a ChatGPT export about 10.
MAX_DEPTH = 64
MAX_SESSIONS = 20_000
MAX_EVENTS_PER_SESSION = 500_000
MAX_NODES_PER_CONVERSATION = 100_000
# How far past this server's clock a time in the file may be: the clock of the server that
# exported it may run a little fast. A later time is not when anything happened, and the
# sidebar, which sorts by the newest time, would keep the session above every other.
CLOCK_SKEW_SECONDS = 600.0


@dataclass
class Upload:
    """An attachment to store before its session is written: `id` is the one its events use."""

    id: str
    name: str
    mime: str
    data: bytes


@dataclass
class SessionPlan:
    """One session to create: its events (with their own times) and the bytes they refer to.
    `key` identifies what was imported (the same file gives the same key: idempotence)."""

    key: str
    source: str  # "tether" | "chatgpt"
    drafts: list[Draft]
    uploads: list[Upload] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    session_id: str = ""  # the new session's id (lineage in the same file points at it)


def linked_only_to(plan: SessionPlan, made: Collection[str]) -> SessionPlan:
    """`plan` without its lineage to sessions of the file this import does not make: one
    imported before (found by its key, not made again) is not the copy the plan named, which
    is never created. The parent's copy would be rotated into no session (409
    `session_rotated` for every turn), a child's copy would name a parent that is not
    there; so each is imported as a session of a file without the other (docs/api.md §12)."""

    def dangling(key: str, value: Any) -> bool:
        return key.endswith("session_id") and isinstance(value, str) and value not in made

    drafts = []
    for draft in plan.drafts:
        lineage = draft.type in (ev.SESSION_CREATED, ev.SESSION_ROTATED)
        if lineage and any(dangling(k, v) for k, v in draft.data.items()):
            if draft.type == ev.SESSION_ROTATED:
                continue  # not rotated into nothing: the copy takes new turns
            draft = replace(draft, data={k: v for k, v in draft.data.items() if not dangling(k, v)})
        drafts.append(draft)
    return replace(plan, drafts=drafts)


class Refusal(Exception):
    """The file is refused; `code` is one of the `import_*` codes of docs/api.md §2."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(code, message, extra)
        self.code, self.message, self.extra = code, message, extra


_CODES = {
    cls.code: cls
    for cls in (
        errors.ImportNotJson,
        errors.ImportUnknownFormat,
        errors.ImportUnsupportedVersion,
        errors.ImportInvalid,
        errors.ImportTooDeep,
        errors.ImportBadBase64,
        errors.ImportTooLarge,
    )
}


def refusal_error(refusal: Refusal) -> errors.ApiError:
    return _CODES[refusal.code](refusal.message, **refusal.extra)


def invalid(path: str, message: str) -> Refusal:
    return Refusal("import_invalid", f"{path}: {message}" if path else message, path=path)


def too_deep(limit: int = MAX_DEPTH) -> Refusal:
    return Refusal(
        "import_too_deep",
        f"The file nests deeper than {limit} levels; an export never does.",
        limit_depth=limit,
    )


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than `limit`, without recursion (a hostile file cannot make the
    check itself overflow)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            raise too_deep(limit)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def finite_time(value: Any) -> float | None:
    """A time in seconds since the epoch, or None for anything that is not one. A time past
    a float's range (an integer that large, or `1e400`, which JSON reads as infinity) is the
    largest float, so `not_future` refuses it as it refuses 1e308."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:
        value = math.inf if value > 0 else -math.inf
    if value == math.inf:
        return sys.float_info.max
    return value if math.isfinite(value) and value >= 0 else None


HALF_PAIR = "holds half a UTF-16 pair (such as \\ud83d alone), which is not text"


def half_pair_at(value: Any, path: str = "") -> str | None:
    """Where under `value` a string holds a lone surrogate (`.text`, `[0]`), or None. JSON may
    escape one, and the log cannot store it: found here, the refusal names where it is.
    Paths are spelled only on the way down to one (most events hold none)."""
    if isinstance(value, str):
        return path if is_half_pair(value) else None
    if isinstance(value, dict):
        if any(is_half_pair(k) for k in value):
            return path
        inner: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        inner = enumerate(value)
    else:
        return None
    for key, item in inner:
        if isinstance(item, str | dict | list) and holds_half_pair(item):
            where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"
            return half_pair_at(item, where)
    return None


def not_future(at: float | None, path: str) -> None:
    """Refuse a time later than now (give or take `CLOCK_SKEW_SECONDS`), naming where it is:
    the file is crafted or its clock broken, as with a negative token count."""
    now = time.time()
    if at is not None and at > now + CLOCK_SKEW_SECONDS:
        said = f"is {at:g} ({_utc(at)}), later than this server's clock ({_utc(now)})"
        raise invalid(path, said + "; an imported session may not sort in the future")


def _utc(at: float) -> str:
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, ValueError, OSError):
        return "after the year 9999"


def join(where: str, rest: str) -> str:
    """A place in the file: `rest` inside the session `where` names (`line 3: events[1]`)."""
    return f"{where}: {rest}" if where and rest else where or rest


def path_of(loc: tuple[Any, ...], where: str = "", inner: str = "") -> str:
    """A pydantic error location under `inner` (`events[3].data` + `text`), in `where`."""
    out = inner
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return join(where, out)
