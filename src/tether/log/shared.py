"""What every replica sharing a database must agree on besides the log: the cookie secret, the
login failures and the settings panel's defaults (the attachment bytes: log/attachments.py).
Each concern is a small protocol with its embedded-mode implementation here, kept in the data
directory or in memory as one process needs; the PostgreSQL ones (log/pg_shared.py) keep it in
the database, so any replica answers what another one wrote. `services.py` picks one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tether.log.private import FILE_MODE, private_dir, tighten, write_whole

log = logging.getLogger("tether")

SETTINGS_FILE = "settings.json"


# -- the cookie secret ----------------------------------------------------------------------
def file_secret(data_dir: Path) -> str:
    """The cookie-signing secret in `<data_dir>/secret_key` (0600), made at first start."""
    private_dir(data_dir)
    path = data_dir / "secret_key"
    try:
        secret = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        secret = ""
    if len(secret) < 32:
        secret = new_secret()
        write_whole(path, (secret + "\n").encode("ascii"))
    tighten(path, FILE_MODE)
    return secret


def new_secret() -> str:
    return secrets.token_urlsafe(48)


# -- the login rate limit -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rule:
    """At most `max_failures` failed logins per key within `window` seconds."""

    max_failures: int
    window: float


PER_ADDRESS = Rule(5, 60.0)
PER_USER = Rule(10, 300.0)  # `--auth accounts`: many addresses guessing one password


class LoginLimits(Protocol):
    async def attempt(self, checks: Sequence[tuple[str, Rule]]) -> int:
        """Count one failure against every key, unless one of them is at its limit: then
        count nothing and return the whole seconds until all may try again (else 0). It is
        counted before the (slow) password check, so guesses sent in parallel are limited
        too; one atomic step, so parallel guesses through several replicas are as well."""

    async def reset(self, keys: Sequence[str]) -> None:
        """A successful login forgets the keys' failures."""

    async def forgive(self, key: str) -> None:
        """Forget the key's latest failure: the attempt counted before its check was right.
        (Under `--auth accounts` a sign-in forgives its address this one attempt and no
        more, so one's own account cannot wipe out guesses at other names.)"""

    async def aclose(self) -> None: ...


class MemoryLoginLimits:
    """The failures in this process's memory (the embedded mode is one process), on its
    monotonic clock, for at most `max_keys` keys."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self.max_keys = max_keys
        self._failures: dict[str, tuple[float, deque[float]]] = {}

    def _recent(self, key: str, window: float, now: float) -> deque[float]:
        failures = self._failures.get(key, (window, deque()))[1]
        while failures and now - failures[0] >= window:
            failures.popleft()
        return failures

    async def attempt(self, checks: Sequence[tuple[str, Rule]]) -> int:
        now = time.monotonic()
        wait = 0
        for key, rule in checks:
            failures = self._recent(key, rule.window, now)
            if len(failures) >= rule.max_failures:
                wait = max(wait, max(1, math.ceil(rule.window - (now - failures[0]))))
        if wait:
            return wait
        for key, rule in checks:
            failures = self._recent(key, rule.window, now)
            failures.append(now)
            self._failures[key] = (rule.window, failures)
        if len(self._failures) > self.max_keys:
            for key in [k for k, (w, _) in self._failures.items() if not self._recent(k, w, now)]:
                del self._failures[key]
            while len(self._failures) > self.max_keys:
                del self._failures[next(iter(self._failures))]
        return 0

    async def reset(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._failures.pop(key, None)

    async def forgive(self, key: str) -> None:
        found = self._failures.get(key)
        if found is not None and found[1]:
            found[1].pop()

    async def aclose(self) -> None:
        return None


# -- the settings panel's defaults ----------------------------------------------------------
class SavedSettings(Protocol):
    """What `PATCH /api/settings` saved (sessions/defaults.py validates it): key to text."""

    async def load(self) -> dict[str, str]: ...

    async def save(self, changes: dict[str, str | None]) -> None:
        """Set each key given (None removes it), together; durable when it returns."""

    async def aclose(self) -> None: ...


class FileSettings:
    """`settings.json` in the data directory (0600), read once at start (only this process
    writes it) and written whole at each change."""

    def __init__(self, data_dir: Path, keys: Sequence[str]) -> None:
        self.path = data_dir / SETTINGS_FILE
        self._lock = asyncio.Lock()
        self._saved = self._read(keys)

    def _read(self, keys: Sequence[str]) -> dict[str, str]:
        try:
            raw: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s cannot be read (%s): the command line's defaults apply", self.path, exc)
            return {}
        if not isinstance(raw, dict):
            return {}
        return {key: raw[key] for key in keys if isinstance(raw.get(key), str)}

    async def load(self) -> dict[str, str]:
        return dict(self._saved)

    async def save(self, changes: dict[str, str | None]) -> None:
        async with self._lock:
            saved = dict(self._saved)
            for key, value in changes.items():
                if value is None:
                    saved.pop(key, None)
                else:
                    saved[key] = value
            if saved != self._saved:
                text = json.dumps(saved, ensure_ascii=False, indent=1).encode("utf-8")
                await asyncio.to_thread(write_whole, self.path, text)
                self._saved = saved

    async def aclose(self) -> None:
        return None
