"""The offline demo runtime: no model, no network, the same answer every time.

It exists so that a newcomer sees every part of the UI working at once (reasoning, interim
progress, two harmless tool calls, a Markdown answer with code) and so that tests have a
deterministic runtime. Everything it says is labelled as the demo's.
A message that starts with `/slow` streams ten times slower (handy for trying Stop).
`/approve` asks the user's approval for a pretend dangerous command (nothing runs).
`/stubborn N` plays an agent stuck in a tool that ignores Stop for N seconds (default 10,
at most 60): Stop still ends the turn at once, and the session stays busy until the worker
lets go or `--cancel-reclaim-seconds` reclaims it (docs/runs.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from tether.runtimes.base import (
    ApprovalRequested,
    ApprovalResolved,
    Capabilities,
    ReasoningDelta,
    Runtime,
    RuntimeEvent,
    RuntimeStream,
    TextDelta,
    ToolCompleted,
    ToolStarted,
    TurnInput,
    Usage,
)
from tether.settings import Settings

DEFAULT_DELAY_SECONDS = 0.03
APPROVAL_WAIT_SECONDS = 300.0
STUBBORN_DEFAULT_SECONDS = 10.0
STUBBORN_MAX_SECONDS = 60.0
STUBBORN_TICK_SECONDS = 0.2


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if p.get("type") == "text")
            return content or ""
    return ""


def _pieces(text: str) -> list[str]:
    """Split like a tokenizer would, keeping whitespace, so deltas look like streaming."""
    return re.findall(r"\s*\S+|\s+", text)


def _stubborn_seconds(prompt: str) -> float:
    words = prompt.split()
    try:
        seconds = float(words[1]) if len(words) > 1 else STUBBORN_DEFAULT_SECONDS
    except ValueError:
        seconds = STUBBORN_DEFAULT_SECONDS
    return min(max(seconds, 0.0), STUBBORN_MAX_SECONDS)


async def _stubborn(prompt: str) -> AsyncIterator[RuntimeEvent]:
    """A worker that does not honour an interrupt, as a hung tool would: cancellation is
    swallowed and output keeps coming until its time is up. Tether must fence that output
    off the log once the run has finished (contract invariant 9)."""
    seconds = _stubborn_seconds(prompt)
    yield ReasoningDelta(
        f"Demo: this turn ignores Stop for {seconds:g} seconds, like an agent stuck in a tool."
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(asyncio.CancelledError):  # the interrupt it does not honour
            await asyncio.sleep(STUBBORN_TICK_SECONDS)
        yield TextDelta(" still working")
    yield TextDelta(" done.")


async def _ask_approval(turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
    """An approval prompt like Hermes Agent's for a command its rules flag; the pretend
    command never runs, whatever the answer."""
    command = "rm -rf ./demo-scratch"
    call_id = f"{turn.stream_id}_demo_cleanup"
    yield TextDelta("Demo: I would like to clear a scratch folder, which needs your approval.")
    yield ToolStarted(call_id, "terminal", {"command": command})
    started = time.monotonic()
    yield ApprovalRequested("ap1", command, "recursive delete (demo: nothing is deleted)")
    choice, reason = "deny", "stopped"
    if turn.approvals is not None:
        try:
            choice, reason = (
                await asyncio.wait_for(turn.approvals.open("ap1"), APPROVAL_WAIT_SECONDS),
                "user",
            )
        except TimeoutError:
            reason = "timeout"
    yield ApprovalResolved("ap1", choice, reason)
    allowed = choice == "once"
    yield ToolCompleted(
        call_id,
        "terminal",
        "(demo) ./demo-scratch would have been cleared"
        if allowed
        else "BLOCKED: the user did not approve this command",
        not allowed,
        int((time.monotonic() - started) * 1000),
    )
    yield TextDelta(
        "You allowed it: the (pretend) folder is clear."
        if allowed
        else "You denied it, so I left the folder alone."
    )


class DemoRuntime(Runtime):
    name = "demo"
    description = "the offline demo: canned answers, no model"
    stateless = True
    capabilities = Capabilities(
        tools=True, attachments=("image", "text"), steer=True, approvals=True
    )
    model = "tether-demo"
    demo = True

    def __init__(self, settings: Settings):
        self.delay = float(os.environ.get("TETHER_DEMO_DELAY", DEFAULT_DELAY_SECONDS))

    def accepts(self, mime: str) -> bool:
        return mime.startswith(("image/", "text/")) or mime in ("application/json",)

    async def stream(self, turn: TurnInput) -> RuntimeStream:
        prompt = _last_user_text(turn.messages).strip()
        if prompt.startswith("/approve"):
            async for e in _ask_approval(turn):
                yield e
            return
        if prompt.startswith("/stubborn"):
            async for e in _stubborn(prompt):
                yield e
            return
        delay = self.delay * (10 if prompt.startswith("/slow") else 1)
        words = len(prompt.split())
        preview = prompt[:60] + ("…" if len(prompt) > 60 else "")

        async def say(kind: type, text: str) -> AsyncIterator[RuntimeEvent]:
            for piece in _pieces(text):
                await asyncio.sleep(delay)
                yield kind(piece)

        async for e in say(
            ReasoningDelta,
            "The user wrote a message. This is the offline demo "
            "runtime, so I will count its words and mirror its opening with two "
            "harmless tools, then answer in Markdown.",
        ):
            yield e
        async for e in say(TextDelta, "Let me look at your message with two small tools."):
            yield e
        for call_id, name, args, result in (
            ("demo_count", "word_count", {"text": preview}, str(words)),
            ("demo_mirror", "mirror", {"text": preview}, preview[::-1]),
        ):
            yield ToolStarted(f"{turn.stream_id}_{call_id}", name, args)
            started = time.monotonic()
            await asyncio.sleep(delay * 5)
            yield ToolCompleted(
                f"{turn.stream_id}_{call_id}",
                name,
                result,
                False,
                int((time.monotonic() - started) * 1000),
            )
        # The next step after the tool results: take in what the user steered meanwhile.
        steered = turn.steer.drain() if turn.steer is not None else []
        async for e in say(
            ReasoningDelta,
            "Both tools answered; time to write the reply."
            + (" The user also steered me while I worked." if steered else ""),
        ):
            yield e
        steer_note = "".join(f"- you also said: *{text}*\n" for text in steered)
        answer = (
            "**This is Tether's offline demo runtime**: no model was called.\n\n"
            f"You wrote {words} word{'s' if words != 1 else ''}:\n\n> {preview}\n\n"
            f"- mirrored: `{preview[::-1]}`\n"
            f"{steer_note}"
            "- to talk to a real model, start Tether with `--runtime openai`\n\n"
            '```python\nprint("hello from the demo runtime")\n```\n'
        )
        async for e in say(TextDelta, answer):
            yield e
        yield Usage(
            prompt_tokens=sum(len(str(m.get("content", ""))) for m in turn.messages) // 4,
            completion_tokens=len(answer) // 4,
        )

    async def summarize(self, messages: list[dict[str, Any]], model: str | None) -> str:
        """A deterministic stand-in for a model's handoff summary (rotation works offline)."""
        users = [m for m in messages if m["role"] == "user"]
        return (
            f"Demo summary: {len(messages)} messages so far; the user's last request was "
            f"{_last_user_text(users)[:120]!r}."
        )

    async def aclose(self) -> None:
        return None
