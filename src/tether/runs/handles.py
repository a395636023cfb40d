"""Runtime handles, their per-session reusable cache, and write-back ownership.

A handle is what a stateful runtime builds to run a session's turns (Hermes Agent's `AIAgent`);
stateless runtimes get a `StatelessHandle`. The contract's "Agent registration after
cancellation" rules, as Tether keeps them:

- Registration of a handle for a run, publication in the reusable cache and the lifecycle
  handle are one step, `HandleCache.admit`, taken on the event loop with no await inside, and
  it admits only a run that Stop has not won. (The contract's lock order STREAMS_LOCK then
  SESSION_AGENT_CACHE_LOCK collapses into that one atomic step; no lock spans a model or tool
  call.)
- A candidate built after Stop won is never published and never invoked; it alone gets
  construction-cancellation cleanup (`close`). A borrowed cache hit whose registration is
  rejected is left untouched: no interrupt, no close.
- Ownership is by exact stream id. An old worker releases or retires only what it still owns;
  absent ownership is not permission, so it can never clear a successor's entry.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tether.runtimes.base import Runtime, RuntimeHandle, RuntimeStream, TurnInput


class StatelessHandle:
    """For runtimes with no per-session state: cancelling the consuming task is the
    interrupt, and there is nothing to close."""

    def __init__(self, runtime: Runtime):
        self._runtime = runtime

    def stream(self, turn: TurnInput) -> RuntimeStream:
        return self._runtime.stream(turn)

    def interrupt(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def open_handle(runtime: Runtime, session_id: str) -> RuntimeHandle:
    handle = await runtime.open_handle(session_id)
    return handle if handle is not None else StatelessHandle(runtime)


@dataclass
class _Entry:
    handle: RuntimeHandle
    owner: str | None  # the stream that holds write-back ownership, if any


class HandleCache:
    def __init__(self, capacity: int = 25):
        self._capacity = capacity
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def borrow(self, session_id: str) -> RuntimeHandle | None:
        entry = self._entries.get(session_id)
        return None if entry is None else entry.handle

    def owner(self, session_id: str) -> str | None:
        entry = self._entries.get(session_id)
        return None if entry is None else entry.owner

    def admit(self, session_id: str, stream_id: str, handle: RuntimeHandle) -> list:
        """Register `handle` for `stream_id`: cache entry + lifecycle + ownership at once.
        Returns evicted handles (to close outside this step)."""
        self._entries[session_id] = _Entry(handle, stream_id)
        self._entries.move_to_end(session_id)
        evicted = []
        for sid in list(self._entries):
            if len(self._entries) <= self._capacity:
                break
            if self._entries[sid].owner is None:  # never evict an active worker's handle
                evicted.append(self._entries.pop(sid).handle)
        return evicted

    def holds(self, session_id: str, stream_id: str, handle: RuntimeHandle) -> bool:
        entry = self._entries.get(session_id)
        return entry is not None and entry.owner == stream_id and entry.handle is handle

    def release(self, session_id: str, stream_id: str) -> None:
        """The run ended: keep the handle for reuse, give up ownership if still ours."""
        entry = self._entries.get(session_id)
        if entry is not None and entry.owner == stream_id:
            entry.owner = None

    def retire(self, session_id: str, stream_id: str) -> RuntimeHandle | None:
        """Stop won before invocation: drop the entry only while this exact stream owns it."""
        entry = self._entries.get(session_id)
        if entry is None or entry.owner != stream_id:
            return None
        del self._entries[session_id]
        return entry.handle

    def forget(self, session_id: str) -> RuntimeHandle | None:
        """The session is gone (deleted)."""
        entry = self._entries.pop(session_id, None)
        return None if entry is None else entry.handle
