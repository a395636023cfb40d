"""How the fake answers ``POST /v1/chat/completions``: the next scripted reply, as an SSE
stream of ``chat.completion.chunk`` objects or as one ``chat.completion`` body, with its
control steps (delay, barrier, hang, drop, ...) played out along the way and the client's
disconnect noticed at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable
from typing import Any

from .response import Response
from .state import FakeState
from .steps import (
    Barrier,
    Delay,
    Drop,
    End,
    ErrorReply,
    Hang,
    MalformedReply,
    Raw,
    Reasoning,
    Reply,
    Stall,
    Step,
    StreamError,
    Text,
    ToolCall,
    Verbatim,
)

_TICK = 0.01  # polling period (s) for barrier release / fake shutdown


class _Aborted(Exception):
    """The fake is stopping: cut the response off."""


class ChatCompletions(FakeState):
    """FakeOpenAI's answers to chat completion requests, apart from its server plumbing."""

    model: str  # the model named in answers when the request names none; set by FakeOpenAI
    reasoning_field: str  # the delta / message field reasoning is sent in; set by FakeOpenAI

    async def _guarded(self, producer: Any, receive: Any, resp: Response) -> None:
        """Run ``producer`` while watching for the client going away."""

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    break
            if not resp.finished:
                self._record_disconnect()

        prod_task = asyncio.ensure_future(producer)
        watch_task = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({prod_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (prod_task, watch_task):
                if not task.done():
                    task.cancel()
            for task in (prod_task, watch_task):
                with contextlib.suppress(asyncio.CancelledError, _Aborted):
                    await task
        # If the producer returned without finishing (drop / fake stopping), uvicorn closes
        # the connection abruptly, which is exactly what we want.

    async def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if self._stopping.is_set():
                raise _Aborted
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, _TICK))

    async def _control(self, step: Step) -> None:
        if isinstance(step, Delay):
            await self._sleep(step.seconds)
        elif isinstance(step, Barrier):
            self._event(self._reached, step.name).set()
            released = self._event(self._released, step.name)
            while not released.is_set():
                await self._sleep(_TICK)
        elif isinstance(step, Hang):
            while True:
                await self._sleep(1.0)

    async def _chat(self, body: dict[str, Any], seq: int, resp: Response) -> None:
        rep = self._next_reply()
        if isinstance(rep, ErrorReply):
            if isinstance(rep.body, str):
                await resp.start(rep.status, "text/html", rep.headers)
                await resp.finish(rep.body.encode())
            else:
                await resp.json(rep.status, rep.body, rep.headers)
            return
        stream = bool(body.get("stream")) and not (isinstance(rep, Reply) and rep.unstreamed)
        if isinstance(rep, MalformedReply):
            ctype = "text/event-stream" if stream else "application/json"
            await resp.start(200, ctype)
            await resp.finish(rep.payload.encode())
            return
        if rep.steps and isinstance(rep.steps[0], Stall):
            await self._control(Hang())
        model = body.get("model") or self.model
        usage = self._usage(body, rep)
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            await self._stream(rep, seq, model, usage, include_usage, resp)
        else:
            await self._complete(rep, seq, model, usage, resp)

    def _usage(self, body: dict[str, Any], rep: Reply) -> dict[str, Any]:
        prompt = max(1, len(json.dumps(body.get("messages", []))) // 4)
        out_chars = len(rep.text) + len(rep.reasoning)
        out_chars += sum(len(t.name) + len(t.arguments_json) for t in rep.tool_calls)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": max(1, out_chars // 4),
        }
        usage.update(rep.usage or {})
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        return usage

    async def _stream(
        self,
        rep: Reply,
        seq: int,
        model: str,
        usage: dict[str, Any],
        include_usage: bool,
        resp: Response,
    ) -> None:
        created = int(time.time())
        cid = f"chatcmpl-fake-{seq}"

        def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
            obj: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fake",
                "choices": []
                if delta is None
                else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                obj["usage"] = usage if delta is None else None
            return f"data: {json.dumps(obj)}\n\n".encode()

        await resp.start(200, "text/event-stream", {"cache-control": "no-cache"})
        await resp.body(chunk({"role": "assistant", "content": ""}))
        tool_index = 0
        for step in rep.steps:
            if isinstance(step, Reasoning):
                await resp.body(chunk({self.reasoning_field: step.text}))
            elif isinstance(step, Text):
                await resp.body(chunk({"content": step.text}))
            elif isinstance(step, ToolCall):
                await resp.body(
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": tool_index,
                                    "id": step.id,
                                    "type": "function",
                                    "function": {"name": step.name, "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                for piece in _split(step.arguments_json, step.pieces):
                    await resp.body(
                        chunk(
                            {
                                "tool_calls": [
                                    {
                                        "index": tool_index,
                                        "function": {"arguments": piece},
                                    }
                                ]
                            }
                        )
                    )
                tool_index += 1
            elif isinstance(step, StreamError):
                err = {
                    "error": {
                        "message": step.message,
                        "type": step.type,
                        "param": None,
                        "code": step.code,
                    }
                }
                await resp.finish(f"data: {json.dumps(err)}\n\n".encode())
                return
            elif isinstance(step, Drop):
                return  # uvicorn closes the socket: incomplete chunked body
            elif isinstance(step, Raw):
                await resp.body(f"data: {step.payload}\n\n".encode())
            elif isinstance(step, Verbatim):
                await resp.body(step.payload.encode())
            elif isinstance(step, End):
                await resp.finish()
                return
            else:
                await self._control(step)
        await resp.body(chunk({}, rep.resolved_finish_reason()))
        if include_usage:
            await resp.body(chunk(None))
        await resp.finish(b"data: [DONE]\n\n")

    async def _complete(
        self, rep: Reply, seq: int, model: str, usage: dict[str, Any], resp: Response
    ) -> None:
        for step in rep.steps:
            if isinstance(step, StreamError):
                err = {
                    "error": {
                        "message": step.message,
                        "type": step.type,
                        "param": None,
                        "code": step.code,
                    }
                }
                await resp.json(step.status, err)
                return
            if isinstance(step, Drop):
                # Promise a body, send half of nothing, hang up.
                await resp.start(200, "application/json", content_length=1000)
                await resp.body(b'{"id": "chatcmpl-fake-')
                return
            await self._control(step)
        message: dict[str, Any] = {"role": "assistant", "content": rep.text or None}
        if rep.reasoning:
            message[self.reasoning_field] = rep.reasoning
        if rep.tool_calls:
            message["tool_calls"] = [
                {
                    "id": t.id,
                    "type": "function",
                    "function": {"name": t.name, "arguments": t.arguments_json},
                }
                for t in rep.tool_calls
            ]
        await resp.json(
            200,
            {
                "id": f"chatcmpl-fake-{seq}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "system_fingerprint": "fake",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": rep.resolved_finish_reason(),
                    }
                ],
                "usage": usage,
            },
        )


def _split(s: str, pieces: int) -> Iterable[str]:
    """Split ``s`` into at most ``pieces`` non-empty fragments (one "" if ``s`` is empty)."""
    if not s:
        return [""]
    size = max(1, -(-len(s) // pieces))
    return [s[i : i + size] for i in range(0, len(s), size)]
