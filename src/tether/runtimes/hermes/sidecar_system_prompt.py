"""An agent's system prompt, seen from the sidecar (hermes-agent's interpreter; stdlib only):
built ahead for a new agent's first turn, and its own part reported to Tether at each turn's
first model request and whenever it changes (`agent.system_prompt`, docs/hermes.md), so that
the context view shows the whole system message the model gets.

Hermes composes that message as `(own + "\\n\\n" + ephemeral).strip()`, where `ephemeral` is
Tether's system prompt for the session (`AIAgent.ephemeral_system_prompt`). The own part is
read from each request rather than from the agent: Hermes restores a stored prompt, rebuilds
it after a compression and sanitises it on some errors, and only the request says which one
was sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

PREBUILT_PROMPT_SECONDS = 60.0  # a prompt built ahead is used by a turn this soon only


def own_system_part(sent: str, ephemeral: str | None) -> str | None:
    """What Hermes put before `ephemeral` in the system message `sent`; None when `sent` is
    not composed so."""
    if not ephemeral:
        return sent
    if sent == ephemeral.strip():
        return ""
    tail = "\n\n" + ephemeral.rstrip()
    return sent[: -len(tail)] if sent.endswith(tail) else None


class SystemPrompt:
    """One agent's system prompt: the one built ahead, and the own part last reported."""

    def __init__(self, report: Callable[[str], None]):
        self._report = report
        self._reported: str | None = None
        self._lock = threading.Lock()
        self._prebuilt: tuple[float, tuple[Any, ...], str] | None = None
        self.prebuilt_done = threading.Event()  # set by prebuild (the host calls it)

    def prebuild(self, agent: Any, build: Callable[[Any, Any], str]) -> None:
        """Build the system prompt a new agent's first turn builds (skills, context files,
        memory: 10-20 ms), on the thread that built the agent, right after Tether was told
        it is open, while Tether prepares that turn. The turn takes it instead of building
        it again; Hermes still restores a stored one, persists it and runs its session-start
        hooks as usual."""
        try:
            identity = (agent.model, agent.provider, agent.session_id)
            prompt = build(agent, None)
            with self._lock:
                self._prebuilt = (time.monotonic(), identity, prompt)
        except Exception:  # the turn builds it itself
            pass
        finally:
            self.prebuilt_done.set()

    def take_prebuilt(self, agent: Any, system_message: Any) -> str | None:
        if system_message is not None:
            return None
        self.prebuilt_done.wait(10)
        with self._lock:
            prebuilt, self._prebuilt = self._prebuilt, None
        if prebuilt is None:
            return None
        built_at, identity, prompt = prebuilt
        current = (agent.model, agent.provider, agent.session_id)
        if identity != current or time.monotonic() - built_at > PREBUILT_PROMPT_SECONDS:
            return None
        return prompt

    def new_turn(self) -> None:
        """Report the own part again at the turn's first request: the last report may not
        have reached the log (a Stop before it was recorded, another runtime's run since);
        Tether drops a report equal to what its log already holds."""
        with self._lock:
            self._reported = None

    def saw_request(self, api_kwargs: Any, ephemeral: str | None) -> None:
        """Report the own part of a model request's system message when it changed."""
        sent = sent_system_text(api_kwargs)
        own = own_system_part(sent, ephemeral) if sent is not None else None
        with self._lock:  # held while reporting, so two requests report in their order
            if own is not None and own != self._reported:
                self._reported = own
                self._report(own)


SYSTEM_ROLES = frozenset({"system", "developer"})  # Hermes sends "developer" to gpt-5 models


def sent_system_text(api_kwargs: Any) -> str | None:
    """The text of the system message a chat-completions request opens with ("" when it
    opens with none); None for another API shape or content that is not text."""
    messages = api_kwargs.get("messages") if isinstance(api_kwargs, dict) else None
    if not isinstance(messages, list):
        return None
    head = messages[0] if messages else None
    if not isinstance(head, dict) or head.get("role") not in SYSTEM_ROLES:
        return ""
    content = head.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # prompt caching sends text parts with cache_control
        texts = [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
        return "".join(texts) if len(texts) == len(content) else None
    return None
