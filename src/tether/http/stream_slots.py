"""How many SSE streams one client may hold open (issue: limits with clear errors). A browser
tab needs one; a client over the limit gets 429 `too_many_streams` instead of exhausting the
server's memory or file descriptors."""

from __future__ import annotations

from collections import Counter


class StreamSlots:
    def __init__(self, per_client: int):
        self.per_client = per_client
        self._open: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self._open.values())

    def acquire(self, client: str) -> Slot | None:
        if self._open[client] >= self.per_client:
            return None
        self._open[client] += 1
        return Slot(self, client)


class Slot:
    """Released once, whoever gets there first (the stream's end or the response's end)."""

    def __init__(self, slots: StreamSlots, client: str):
        self._slots = slots
        self._client = client
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._open[self._client] -= 1
            if self._slots._open[self._client] <= 0:
                del self._slots._open[self._client]
