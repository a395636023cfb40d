"""`--compression-mode rotate`: between turns, a session whose context crossed the threshold
continues in a child session.

The turn that crossed the threshold finishes in the parent (compressing in place if it had to).
Then, while that finished run still holds the session (so no turn can slip in), one summary
request produces the handoff, the child is created with it (`parent_session_id`, its model
context starts from the summary; it shows the parent's history above its own, display only)
and `session.rotated` is appended to the parent. Rotation is maintenance: the child inherits
the parent's `updated_at`, and nothing moves in the sidebar order.
"""

from __future__ import annotations

import logging
from typing import Any

from tether import events as ev
from tether.events import new_id
from tether.ingest.normalizer import Normalizer
from tether.log import Draft
from tether.runtimes.base import ProviderError, Runtime
from tether.sessions.service import SessionService
from tether.settings import Settings

log = logging.getLogger("tether.runs")


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """About four characters a token, the estimate the runtimes use without provider usage."""
    return sum(
        len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages
    ) // 4 + 4 * len(messages)


class Rotator:
    """The engine's `Rotation` (runs/engine.py): it acts on the sessions, not on the engine."""

    def __init__(self, sessions: SessionService, runtime: Runtime, settings: Settings):
        self.sessions = sessions
        self.runtime = runtime
        self.settings = settings

    def _window(self) -> int | None:
        return self.settings.context_window or self.runtime.context_window

    def crossed(self, normalizer: Normalizer) -> bool:
        if normalizer.compressed:
            return True
        window = self._window()
        usage = normalizer.usage
        if not window or not usage:
            return False
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        return used >= self.settings.compression_threshold * window

    async def maybe_rotate(self, session_id: str, normalizer: Normalizer) -> str:
        """Rotate if this turn crossed the threshold; return where the next turn goes."""
        if self.settings.compression_mode != "rotate" or not self.crossed(normalizer):
            return session_id
        try:
            return await self.rotate(session_id)
        except ProviderError as exc:
            log.warning(
                "rotation of %s skipped: the summary request failed: %s", session_id, exc.message
            )
            return session_id

    async def rotate(self, parent_id: str) -> str:
        fold = await self.sessions.folds.get(parent_id)
        messages = fold.transcript.context()["context_messages"]
        summary = await self.runtime.summarize(messages, None)
        return await continue_in(
            self.sessions,
            parent_id,
            new_id("s"),
            create=True,
            handoff={
                "summary": summary,
                "tokens_before": estimate_tokens(messages),
                "tokens_after": estimate_tokens([{"content": summary}]),
            },
        )


async def continue_in(
    sessions: SessionService, parent_id: str, child_id: str, *, create: bool, **created: object
) -> str:
    """Make `parent_id` continue in `child_id` (created here, or already there): the child
    takes the parent's place in the sidebar without looking newer, the parent records
    `session.rotated`, queued messages move along. `created` goes into the child's
    `session.created` (its handoff, the agent session it drives)."""
    store = sessions.store
    fold = await sessions.folds.get(parent_id)
    parent = await sessions.row(parent_id)
    assert parent is not None and fold.row is not None
    if create:
        await sessions.create_log(
            child_id,
            [
                Draft(
                    ev.SESSION_CREATED,
                    {
                        "title": fold.row["title"] or fold.row["title_from_message"],
                        "parent_session_id": parent_id,
                        "inherited_updated_at": parent["updated_at"],
                        "inherited_last_message_at": parent["last_message_at"],
                        **created,
                    },
                )
            ],
            owner=await store.session_owner(parent_id),  # the parent's person
        )
    moved = list(fold.transcript.queued.values())
    await store.append(
        parent_id,
        [Draft(ev.SESSION_ROTATED, {"continuation_session_id": child_id})]
        + [Draft(ev.QUEUE_REMOVED, {"queue_id": q["queue_id"], "reason": "moved"}) for q in moved],
    )
    if moved:  # queued messages follow the conversation into the child
        await store.append(
            child_id,
            [
                Draft(
                    ev.QUEUE_ADDED,
                    {
                        "queue_id": q["queue_id"],
                        "text": q["text"],
                        "attachments": [
                            {k: a[k] for k in ("id", "name", "mime", "size")}
                            for a in q["attachments"]
                        ],
                    },
                )
                for q in moved
            ],
        )
    log.info("session %s continues in %s", parent_id, child_id)
    return child_id
