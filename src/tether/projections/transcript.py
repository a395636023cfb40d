"""The visible transcript, the pending turn and the live scene as one fold (docs/api.md §3, §5).

A submitted turn is a visible user row at once (invariant 2: it stays before everything its
run produces). The run's output gathers in a live scene until `run.finished` settles it into
exactly one assistant row that keeps its partial timeline and says in a `notice` why it ended.
Live and settled timelines come from the same items (folded in projections/run_items.py), so a
reload shows what streaming showed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tether import events as ev
from tether.events import Event
from tether.projections.agent_rows import imported_rows
from tether.projections.branches import BranchTree
from tether.projections.context import agent_system_message, context_messages
from tether.projections.run_items import ITEM_FOLDS, RunScene, settle_steer
from tether.projections.timeline import timeline_view


class AgentPrompt(NamedTuple):
    """The agent's own part of its system message (`agent.system_prompt`), and the runtime
    whose agent sent it: None when no run of the fold's recorded it (never seen: the event
    is written inside a run), and such a part is shown for no runtime."""

    text: str
    runtime: str | None


def download_url(session_id: str, attachment_id: str) -> str:
    """Where the page downloads an upload: through the session that holds it, so an id used
    through another session is not found."""
    return f"/api/attachments/{attachment_id}?session_id={session_id}"


CUT_OFF_NOTICE = "Cut off at the token limit: the answer may be incomplete."
# A completed answer the provider ended early, by its finish_reason (the page's reducer.js
# holds the same texts).
FINISH_NOTICES = {
    "length": CUT_OFF_NOTICE,
    "content_filter": "Stopped by the provider's content filter: the answer may be incomplete.",
}


def _finish_notice(state: str, data: dict[str, Any]) -> str | None:
    reason = data.get("finish_reason")
    return (
        reason
        if state == "completed" and isinstance(reason, str) and reason in FINISH_NOTICES
        else None
    )


def notice_kind(state: str, data: dict[str, Any]) -> str:
    """The notice's kind: the run's state, or the finish reason of an answer the provider
    ended early: `length`, cut off at the token limit (the page offers Continue there), or
    `content_filter`."""
    return _finish_notice(state, data) or state


def notice_text(state: str, data: dict[str, Any]) -> str | None:
    error = data.get("error") or {}
    reason = data.get("reason")
    if state == "completed":
        finish = _finish_notice(state, data)
        return FINISH_NOTICES[finish] if finish else None
    if state == "cancelled":
        return "Stopped." if not reason else f"Stopped: {reason}"
    if state == "interrupted":
        return f"Interrupted: {reason or 'the run ended before it could finish'}."
    if state == "error":
        return f"Error ({error.get('code', 'internal')}): {error.get('message', 'unknown error')}"
    if state == "tool_limit_reached":
        return "Stopped: the run reached its tool-call limit before it could answer."
    if state == "compression_exhausted":
        return (
            "Stopped: the conversation no longer fits the model's context window, "
            "even after compression."
        )
    return f"Ended: {state}"


def _user_row(event: Event) -> dict[str, Any]:
    """The visible row of a new turn's `turn.submitted`."""
    data = event.data
    return {
        "id": data["turn_id"],
        "role": "user",
        "turn_id": data["turn_id"],
        "created_at": data.get("submitted_at", event.at),
        "content": data.get("text", ""),
        "attachments": [
            {**a, "url": download_url(event.session_id, a["id"])}
            for a in data.get("attachments") or []
        ],
    }


class TranscriptFold:
    """Fold state; `apply` ignores events it has already seen, `view` returns fresh copies."""

    def __init__(self) -> None:
        self.last_seq = 0
        # The seq of the last event that hid rows shown (a truncate, a branch switch): a view
        # folded before it is not what the model would get (runs/engine.py, `after_seq`).
        self.hidden_at = 0
        # The seq of the last event that added a row to the transcript shown (a message, an
        # answer settled, imported turns): a view folded before it lacks the row that is now
        # "the last answer" (a regenerate without a row, runs/engine.py).
        self.grown_at = 0
        self.messages: list[dict[str, Any]] = []  # the visible transcript: the branch shown
        self.tree = BranchTree(self.messages)  # every branch (docs/api.md §10)
        self.active: dict[str, RunScene] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.queued: dict[str, dict[str, Any]] = {}
        # Queued messages whose run was stopped or failed, or that rows were hidden from
        # (a truncate, a branch switch: their sender never saw what they would follow)
        # since they were queued (docs/api.md §4): they wait for the user (`queue/start`),
        # and a later run that completes does not send them. Starting one of them resumes
        # the queue. Server-side only: never part of `view()`.
        self.held: set[str] = set()
        # Agent-facing only (invariant 6): never part of `view()`.
        self.compressions: list[dict[str, Any]] = []
        self.handoff: dict[str, Any] | None = None
        # What another client of the agent wrote (`agent.imported`): where the next pass
        # starts, and compactions it did in place (the model context restarts after the row
        # they follow, on the branches through that row).
        self.agent_watermark = 0
        self.agent_compactions: list[dict[str, Any]] = []
        self.agent_prompt: AgentPrompt | None = None

    def apply(self, event: Event) -> None:
        if event.seq <= self.last_seq:
            return
        self.last_seq = event.seq
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, event)

    # -- event handlers ---------------------------------------------------------------------
    def _session_created(self, event: Event) -> None:
        self.handoff = event.data.get("handoff")

    def _turn_submitted(self, event: Event) -> None:
        data = event.data
        if data.get("regenerate"):  # a new answer to a turn already shown: no new user row
            self.active[data["stream_id"]] = RunScene(
                data["stream_id"], data["turn_id"], data.get("submitted_at", event.at)
            )
            return
        row = _user_row(event)
        self.tree.append(row)
        self.grown_at = event.seq
        self.users[data["turn_id"]] = row
        self.active[data["stream_id"]] = RunScene(
            data["stream_id"], data["turn_id"], data.get("submitted_at", event.at)
        )

    def _scene(self, event: Event) -> RunScene | None:
        return self.active.get(event.stream_id or event.data.get("stream_id", ""))

    def _item(self, event: Event) -> None:
        scene = self._scene(event)
        if scene is not None:
            ITEM_FOLDS[event.type](scene, event)

    def _compression_completed(self, event: Event) -> None:
        """Its divider is an item; its summary is for the agent only (invariant 6)."""
        self._item(event)
        scene = self._scene(event)
        data = event.data
        if scene is not None and data.get("summary") is not None:
            self.compressions.append(
                {
                    "pass_id": data["pass_id"],
                    "summary": data["summary"],
                    "boundary_turn_id": data.get("boundary_turn_id") or scene.turn_id,
                    "stream_id": scene.stream_id,  # its summary is of that run's branch
                    "tokens_before": data.get("tokens_before"),
                    "tokens_after": data.get("tokens_after"),
                }
            )

    def _run_started(self, event: Event) -> None:
        scene = self._scene(event)
        if scene is not None:
            if scene.phase == "starting":
                scene.phase = "running"
            scene.runtime = event.data.get("runtime")
            scene.model = event.data.get("model")
        if self.agent_prompt is not None and self.agent_prompt.runtime != event.data.get("runtime"):
            self.agent_prompt = None  # a run of another runtime sends none of it

    def _agent_system_prompt(self, event: Event) -> None:
        scene = self._scene(event)
        self.agent_prompt = AgentPrompt(event.data["text"], scene.runtime if scene else None)

    def _queue(self, event: Event) -> None:
        data = event.data
        queue_id = data["queue_id"]
        if event.type == ev.QUEUE_ADDED:
            self.queued[queue_id] = {
                "queue_id": queue_id,
                "text": data.get("text", ""),
                "attachments": [
                    {**a, "url": download_url(event.session_id, a["id"])}
                    for a in data.get("attachments") or []
                ],
                "created_at": event.at,
            }
        elif event.type == ev.QUEUE_UPDATED and queue_id in self.queued:
            self.queued[queue_id] = {**self.queued[queue_id], "text": data.get("text", "")}
        elif event.type == ev.QUEUE_REMOVED:
            self.queued.pop(queue_id, None)
            if data.get("reason") == "started" and queue_id in self.held:
                self.held.clear()  # the user sent one that waited: the queue goes on
            self.held.discard(queue_id)

    def _cancel_requested(self, event: Event) -> None:
        scene = self._scene(event)
        if scene is not None:
            scene.phase = "cancelling"

    def _run_finished(self, event: Event) -> None:
        if event.data.get("state", "completed") != "completed":
            self.held.update(self.queued)  # what was queued behind it waits for the user
        scene = self.active.pop(event.stream_id or event.data.get("stream_id", ""), None)
        if scene is None:
            return
        # A steer still waiting when the run ends was never seen by the agent: one recorded
        # through another replica as the run ended has no `steer.leftover` (the owner could
        # not append it any more), and shows as left over all the same (docs/api.md §14).
        for steer_id in list(scene.pending_steers):
            settle_steer(scene, steer_id, leftover=True)
        state = event.data.get("state", "completed")
        # Invariant 6: the compression divider is live-only unless it explains the ending.
        items = [
            item
            for item in scene.items
            if item["type"] != "compression" or state == "compression_exhausted"
        ]
        text = notice_text(state, event.data)
        if text is not None:
            items.append(
                {
                    "id": f"{scene.stream_id}.notice",
                    "type": "notice",
                    "kind": notice_kind(state, event.data),
                    "text": text,
                }
            )
        timeline, answer = timeline_view(items)
        row: dict[str, Any] = {
            "id": scene.stream_id,
            "role": "assistant",
            "turn_id": scene.turn_id,
            "created_at": scene.started_at,
            "finished_at": event.at,
            "content": answer,
            "state": state,
            "stream_id": scene.stream_id,
            "timeline": timeline,
        }
        if scene.model:
            row["model"] = scene.model  # the model that answered (`run.started`)
        if event.data.get("error"):
            row["error"] = dict(event.data["error"])
        if event.data.get("usage"):
            row["usage"] = dict(event.data["usage"])  # the context meter's source
        if event.data.get("finish_reason"):
            row["finish_reason"] = event.data["finish_reason"]
        self.tree.append(row)
        self.grown_at = event.seq

    def _truncated(self, event: Event) -> None:
        """Hide the rows from `keep_count` on: kept as a branch beside what comes next."""
        self.tree.cut(event.data["keep_count"])
        self.hidden_at = event.seq
        self.held.update(self.queued)

    def _branch_switched(self, event: Event) -> None:
        row_id = event.data.get("row_id")
        if isinstance(row_id, str):
            self.tree.show(row_id)
            self.hidden_at = event.seq
            self.held.update(self.queued)

    def _agent_imported(self, event: Event) -> None:
        """Turns another client of the agent wrote, in the order it wrote them; a compaction
        it did in place restarts the model context at that point (display unchanged)."""
        data = event.data
        self.agent_watermark = max(self.agent_watermark, int(data.get("watermark") or 0))
        for entry in data.get("entries") or []:
            if entry.get("kind") == "compaction":
                self.agent_compactions.append(
                    {
                        "after": self.messages[-1]["id"] if self.messages else None,
                        "summary": entry.get("summary") or "",
                        "carried": list(entry.get("context") or []),
                    }
                )
            elif entry.get("kind") == "turn":
                for row in imported_rows(entry):
                    self.tree.append(row)
                    self.grown_at = event.seq

    # -- views ------------------------------------------------------------------------------
    def system_message(self, system_prompt: str | None, runtime: str) -> str | None:
        """The whole system message `runtime`'s agent sends with `system_prompt`: its own
        part first, when it recorded one (what the user is shown; the runtime's own input
        leaves that part out, as the agent adds it itself). Another runtime's part is not
        sent by this one (a server restarted with another `--runtime`)."""
        if self.agent_prompt is None or self.agent_prompt.runtime != runtime:
            return system_prompt
        return agent_system_message(self.agent_prompt.text, system_prompt)

    def context(
        self, system_prompt: str | None = None, pending: Event | None = None
    ) -> dict[str, Any]:
        """The model context of the next call (docs/api.md §3, `GET /api/session/context`),
        opened by `system_prompt` when there is one; with `pending`, a new turn's
        `turn.submitted` not folded yet, as it will be once it is (runs/invocation.py)."""
        messages = self.messages
        shown_runs = set(self.active)
        if pending is not None:
            if not pending.data.get("regenerate"):  # as `_turn_submitted` folds it
                messages = [*messages, _user_row(pending)]
            shown_runs.add(pending.data["stream_id"])
        position = {row["id"]: index for index, row in enumerate(messages)}
        # A compaction counts on the branches through the row it followed.
        compactions = [
            {**c, "at": 0 if c["after"] is None else position[c["after"]] + 1}
            for c in self.agent_compactions
            if c["after"] is None or c["after"] in position
        ]
        return context_messages(
            messages,
            self.compressions,
            self.handoff,
            compactions,
            system_prompt,
            shown_runs={*position, *shown_runs},
        )

    def view(self) -> dict[str, Any]:
        """`messages`, the pending turn and `live`, as fresh objects a caller may keep."""
        messages = [_copy_row(row) for row in self.messages]
        scene = next(iter(self.active.values()), None)
        out: dict[str, Any] = {
            "messages": messages,
            "pending_user_message": None,
            "pending_attachments": [],
            "pending_started_at": None,
            "live": None,
            "queued": [dict(q) for q in self.queued.values()],
            "branches": self.tree.snapshot(_copy_row),
        }
        if scene is not None:
            user = self.users.get(scene.turn_id)
            if user is not None:
                out["pending_user_message"] = user["content"]
                out["pending_attachments"] = [dict(a) for a in user["attachments"]]
            out["pending_started_at"] = scene.started_at
            timeline, _ = timeline_view(scene.items)
            out["live"] = {
                "stream_id": scene.stream_id,
                "turn_id": scene.turn_id,
                "phase": scene.phase,
                "started_at": scene.started_at,
                "runtime": scene.runtime,
                "model": scene.model,
                "timeline": timeline,
                "pending_steers": [
                    {"steer_id": k, "text": v} for k, v in scene.pending_steers.items()
                ],
            }
        return out


def _copy_row(row: dict[str, Any]) -> dict[str, Any]:
    copy = dict(row)
    copy.pop("agent_context", None)  # model-facing only
    if "timeline" in copy:
        copy["timeline"] = [dict(item) for item in copy["timeline"]]
    if "attachments" in copy:
        copy["attachments"] = [dict(a) for a in copy["attachments"]]
    if "branch" in copy:
        copy["branch"] = dict(copy["branch"])
    return copy


_HANDLERS = {
    **dict.fromkeys(ITEM_FOLDS, TranscriptFold._item),  # a run's timeline items: run_items.py
    ev.COMPRESSION_COMPLETED: TranscriptFold._compression_completed,
    ev.SESSION_CREATED: TranscriptFold._session_created,
    ev.QUEUE_ADDED: TranscriptFold._queue,
    ev.QUEUE_UPDATED: TranscriptFold._queue,
    ev.QUEUE_REMOVED: TranscriptFold._queue,
    ev.TURN_SUBMITTED: TranscriptFold._turn_submitted,
    ev.RUN_STARTED: TranscriptFold._run_started,
    ev.RUN_CANCEL_REQUESTED: TranscriptFold._cancel_requested,
    ev.RUN_FINISHED: TranscriptFold._run_finished,
    ev.TRANSCRIPT_TRUNCATED: TranscriptFold._truncated,
    ev.BRANCH_SWITCHED: TranscriptFold._branch_switched,
    ev.AGENT_IMPORTED: TranscriptFold._agent_imported,
    ev.AGENT_SYSTEM_PROMPT: TranscriptFold._agent_system_prompt,
}
