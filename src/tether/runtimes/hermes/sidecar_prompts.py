"""The sidecar's questions to the user: Hermes' approval prompt and its clarify tool.

Both block the agent's thread until Tether answers (ops `approve` and `answer`), nobody does
in time, or the turn stops. Runs in the sidecar's interpreter (hermes-agent's virtualenv),
beside sidecar.py: the standard library only; hermes-agent is imported where it is used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class UserPrompts:
    """The open questions of one agent: id -> (answered, [answer, reason, *offered])."""

    def __init__(
        self,
        emit: Callable[..., None],
        approval_seconds: float,
        clarify_seconds: float | None,
    ):
        self.emit = emit
        self.approval_seconds = approval_seconds
        self.clarify_seconds = clarify_seconds
        self._lock = threading.Lock()
        self.approvals: dict[str, tuple[threading.Event, list[str]]] = {}
        self.approval_count = 0
        self.questions: dict[str, tuple[threading.Event, list[str]]] = {}
        self.question_count = 0

    def on_approval(
        self, command: Any, description: Any, *, allow_permanent: bool = True, **extra: Any
    ) -> str:
        """Hermes' prompt for a command its dangerous-command rules flag: ask Tether and wait
        for the user's answer. No answer in time, or the turn stopped, is a denial.

        The answer is Hermes' own (`tools.approval.prompt_dangerous_approval`): `once`,
        `session` or `always`, which `check_all_command_guards` then records in its session
        allowlist (`approve_session`, keyed by the approval session key) or its permanent
        one (`approve_permanent` + `save_permanent_allowlist`: `command_allowlist` in the
        home's config.yaml), or `deny`. Hermes hides `always` when `allow_permanent` is
        false (tirith findings), and offers only `once` and `deny` when its smart approval
        said DENY and the owner may override it (`smart_denied`)."""
        if extra.get("smart_denied"):
            choices = ["once", "deny"]
        elif allow_permanent:
            choices = ["once", "session", "always", "deny"]
        else:
            choices = ["once", "session", "deny"]
        with self._lock:
            self.approval_count += 1
            approval_id = f"ap{self.approval_count}"
            answered, slot = threading.Event(), ["deny", "timeout", *choices]
            self.approvals[approval_id] = (answered, slot)
        self.emit(
            "approval_requested",
            approval_id=approval_id,
            command=str(command),
            description=str(description),
            choices=choices,
        )
        answered.wait(self.approval_seconds)
        with self._lock:
            self.approvals.pop(approval_id, None)
            choice, reason = slot[:2]
        self.emit("approval_resolved", approval_id=approval_id, choice=choice, reason=reason)
        return choice

    def answer_approval(self, approval_id: str, choice: str, reason: str = "user") -> None:
        with self._lock:
            waiting = self.approvals.get(approval_id)
            if waiting is None or waiting[0].is_set():
                return
            offered = waiting[1][2:]
            waiting[1][:2] = [choice if choice in offered else "deny", reason]
            waiting[0].set()

    def stop_all(self) -> None:
        """The turn stops: every open approval is denied, every open question unanswered."""
        with self._lock:
            open_ids = list(self.approvals)
            open_questions = list(self.questions)
        for approval_id in open_ids:
            self.answer_approval(approval_id, "deny", "stopped")
        for question_id in open_questions:
            self.answer_question(question_id, "", "stopped")

    # -- clarify (the agent's thread blocks here) -------------------------------------------
    def on_clarify(self, question: Any, choices: Any) -> str:
        """Hermes' clarify tool (`tools.clarify_tool`, `callback(question, choices) -> str`):
        ask Tether and wait for the user's answer. When nobody answers (the timeout, or the
        turn stopped), the tool gets the sentinel Hermes' own gateway returns then, so the
        agent decides on its own; the timeout is Hermes' `agent.clarify_timeout` unless
        Tether's config sets one."""
        from tools.clarify_gateway import get_clarify_timeout

        timeout = float(self.clarify_seconds or get_clarify_timeout())
        offered = [str(c) for c in choices] if isinstance(choices, list) else []
        with self._lock:
            self.question_count += 1
            question_id = f"q{self.question_count}"
            answered, slot = threading.Event(), ["", "timeout"]
            self.questions[question_id] = (answered, slot)
        self.emit(
            "clarify_requested", question_id=question_id, question=str(question), choices=offered
        )
        answered.wait(timeout)
        with self._lock:
            self.questions.pop(question_id, None)
            text, reason = slot
        self.emit("clarify_resolved", question_id=question_id, text=text, reason=reason)
        if reason != "user" or not text:
            return f"[user did not respond within {int(timeout / 60)}m]"
        return text

    def answer_question(self, question_id: str, text: str, reason: str = "user") -> None:
        with self._lock:
            waiting = self.questions.get(question_id)
            if waiting is None or waiting[0].is_set():
                return
            waiting[1][:] = [text, reason]
            waiting[0].set()
