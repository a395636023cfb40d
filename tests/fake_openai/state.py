"""What the fake has been told and what it has seen: the scripted replies, the barriers, and
the record of requests and disconnects.

The test thread scripts and observes while the server thread serves, so all of it sits behind
one lock, with a condition for the tests that wait.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from typing import Any, Self

from .steps import AnyReply, Step, coerce_reply, reply, text


class FakeState:
    """The script and the record of a FakeOpenAI; every method is safe from any thread."""

    def __init__(self) -> None:
        self.default_reply: AnyReply = reply(text("ok"))
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._queue: collections.deque[AnyReply] = collections.deque()
        self._requests: list[Any] = []
        self._request_headers: list[dict[str, str]] = []
        self._request_peers: list[tuple[str, int] | None] = []
        self._disconnect_times: list[float] = []
        self._released: dict[str, threading.Event] = {}
        self._reached: dict[str, threading.Event] = {}
        self._stopping = threading.Event()  # set by stop(): blocked responses are cut off
        self._seq = 0

    # ---- scripting --------------------------------------------------------------------------

    def script(self, *replies: AnyReply | Step | str | Sequence[Step | str]) -> Self:
        """Append replies to the queue. Accepts Reply/ErrorReply/MalformedReply, a bare step,
        a str (text reply) or a list of steps."""
        coerced = [coerce_reply(r) for r in replies]
        with self._lock:
            self._queue.extend(coerced)
        return self

    @property
    def pending(self) -> int:
        """Number of scripted replies not yet served."""
        with self._lock:
            return len(self._queue)

    def release(self, name: str) -> None:
        """Open barrier ``name`` (before or after a stream reaches it). Stays open until
        ``reset()``."""
        self._event(self._released, name).set()

    def reached(self, name: str) -> bool:
        return self._event(self._reached, name).is_set()

    def wait_reached(self, name: str, timeout: float = 5.0) -> bool:
        """Wait until some response has reached barrier ``name``; False on timeout."""
        return self._event(self._reached, name).wait(timeout)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> bool:
        """Wait until at least ``n`` chat completion requests were received."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._requests) >= n, timeout)

    def wait_disconnects(self, n: int = 1, timeout: float = 5.0) -> bool:
        """Wait until at least ``n`` client disconnects were observed."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._disconnect_times) >= n, timeout)

    def reset(self) -> None:
        """Forget the queue, recorded requests, disconnects and barrier states; restore the
        default reply. Responses still blocked on a barrier from before are released."""
        with self._lock:
            for ev in self._released.values():
                ev.set()
            self._queue.clear()
            self._requests.clear()
            self._request_headers.clear()
            self._request_peers.clear()
            self._disconnect_times.clear()
            self._released.clear()
            self._reached.clear()
            self.default_reply = reply(text("ok"))

    # ---- observations -----------------------------------------------------------------------

    @property
    def requests(self) -> list[Any]:
        """Parsed JSON bodies of chat completion requests, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> Any:
        with self._lock:
            return self._requests[-1] if self._requests else None

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Headers (lower-case names) of chat completion requests, parallel to ``requests``."""
        with self._lock:
            return [dict(h) for h in self._request_headers]

    @property
    def request_peers(self) -> list[tuple[str, int] | None]:
        """The client address (host, port) of each chat completion request, parallel to
        ``requests``: one TCP connection per distinct address."""
        with self._lock:
            return list(self._request_peers)

    @property
    def requests_count(self) -> int:
        with self._lock:
            return len(self._requests)

    @property
    def disconnects(self) -> int:
        with self._lock:
            return len(self._disconnect_times)

    @property
    def disconnect_times(self) -> list[float]:
        """``time.monotonic()`` of each client disconnect before the response completed."""
        with self._lock:
            return list(self._disconnect_times)

    # ---- internals: state -------------------------------------------------------------------

    def _event(self, table: dict[str, threading.Event], name: str) -> threading.Event:
        with self._lock:
            ev = table.get(name)
            if ev is None:
                ev = table[name] = threading.Event()
            return ev

    def _next_reply(self) -> AnyReply:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default_reply

    def _record(
        self, body: Any, headers: dict[str, str], peer: tuple[str, int] | None = None
    ) -> int:
        with self._changed:
            self._requests.append(body)
            self._request_headers.append(headers)
            self._request_peers.append(peer)
            self._seq += 1
            self._changed.notify_all()
            return self._seq

    def _record_disconnect(self) -> None:
        with self._changed:
            self._disconnect_times.append(time.monotonic())
            self._changed.notify_all()
