"""The OpenAI-compatible runtime: streams Chat Completions from any server that speaks the
OpenAI wire format (OpenAI itself, vLLM, llama.cpp, Ollama, LM Studio, ...) and runs the
read-only workspace tools (`runtimes.tools`) in a loop until the model answers without tools.

Provider failures become `ProviderError` with a stable code and a message a person can act on
(`runtimes.openai_errors` holds the mapping). What the turn asks of the endpoint (its models,
a model's window and tokenizer, a summary, the classification of its failures) is
`runtimes.openai_endpoint`.

Automatic context compression (`runtimes.compression` counts, estimates and splits):

* The window is ``--context-window`` if set, else what the server says about the model
  (`runtimes.openai_models`: ``/v1/models`` fields, llama.cpp ``/props``, LM Studio, Ollama),
  looked up once per model on first use. When none is found, compression is off for that
  model (the provider's ``context_overflow`` error is then the guard). A lookup that cannot
  connect is not remembered and is tried again on the next turn.
* Each request sends ``max_tokens`` (`compression.answer_tokens`), and compression budgets
  the prompt to the window less that room (`compression.Room`). Before every model request
  of a turn, if the request would pass ``compression_threshold x budget`` tokens, a pass runs:
  `CompressionStarted`, one non-streaming summary request without tools, then
  `CompressionCompleted`. Level 1 replaces everything before the current turn's user message
  with one system message holding the summary. If the request still passes the budget,
  level 2 (same pass) also summarizes the current turn's earlier assistant/tool exchanges,
  keeping the user message and the latest exchange. If it still does not fit, the turn ends
  with ``Finished("compression_exhausted")`` and the over-sized request is never sent. A
  provider's ``context_overflow`` before any output forces one pass and one retry. Only what
  is sent changes: `TurnInput.messages` is never modified.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, NoReturn

import openai

from tether.runtimes.attachments import accepts_mime, expand_part
from tether.runtimes.base import (
    AnswerFinished,
    Capabilities,
    CompressionCompleted,
    CompressionStarted,
    Finished,
    ProviderError,
    ReasoningDelta,
    RuntimeEvent,
    RuntimeStream,
    RuntimeUnavailable,
    ToolCompleted,
    ToolStarted,
    TurnInput,
    Usage,
)
from tether.runtimes.compression import (
    Room,
    WorkingContext,
    answer_tokens,
    estimate_tokens,
    estimate_tools_tokens,
    measured_scale,
    summary_request,
)
from tether.runtimes.openai_endpoint import OpenAIEndpoint
from tether.runtimes.openai_errors import (
    error_in,
    hung_up_unanswered,
    send_streamed,
    stream_error,
)
from tether.runtimes.openai_stream import (
    Accumulator,
    WrongShape,
    completion_as_chunk,
    drain,
    parse_arguments,
    sse_lines,
)
from tether.runtimes.tools import ToolRunner, WorkspaceTools
from tether.settings import Settings

MAX_TOOL_ITERATIONS = 10
MAX_REMEMBERED_SESSIONS = 256  # provider counts kept for the first request of the next turn


class OpenAIRuntime(OpenAIEndpoint):
    """A Chat Completions client with a bounded, read-only tool loop."""

    name = "openai"
    description = "any OpenAI-compatible Chat Completions endpoint (--base-url, --model)"
    stateless = True
    capabilities = Capabilities(
        tools=True, attachments=("image", "text"), steer=True, interrupt=True, compression=True
    )

    def __init__(self, settings: Settings, *, max_iterations: int = MAX_TOOL_ITERATIONS):
        if max_iterations < 1:
            raise ValueError("max_iterations must be at least 1")
        self.max_iterations = max_iterations
        self.tools: WorkspaceTools | None = None
        if settings.workspace is not None:
            workspace = Path(settings.workspace).expanduser()
            if not workspace.is_dir():
                raise RuntimeUnavailable(f"The workspace {str(workspace)!r} is not a directory.")
            self.tools = WorkspaceTools(workspace)
            self._tool_runner = ToolRunner(self.tools)
        super().__init__(settings)
        self._tools_tokens = estimate_tools_tokens(self.tools.schemas if self.tools else None)
        self._threshold = min(1.0, max(0.05, float(settings.compression_threshold)))
        self._anchors: dict[str, tuple[str, int, int]] = {}
        self._idle_timeout = float(settings.stream_idle_timeout)

    def accepts(self, mime: str) -> bool:
        return accepts_mime(mime)

    # ---- the turn ----------------------------------------------------------------------------

    async def stream(self, turn: TurnInput) -> RuntimeStream:
        """Model request, tools, model request, ... until an answer without tool calls or
        `max_iterations` requests, compressing the context before a request that would not
        fit. Consumers should close it (`contextlib.aclosing`) when they stop early, so the
        request in flight is closed at once."""
        if turn.attachments:  # reads the files: off the loop
            messages = await asyncio.to_thread(self._build_messages, turn)
        else:  # a shallow copy: a thread hop would cost more than the work
            messages = self._build_messages(turn)
        model = turn.model or self.model
        window = await self._context_window(model)
        # The system prompt opens every request and is never compressed: like the tool
        # schemas, it is a fixed part of each request's size.
        pinned, messages = (messages[:1], messages[1:]) if turn.system_prompt else ([], messages)
        tools_tokens = self._tools_tokens + estimate_tokens(pinned)
        ctx = WorkingContext(messages, tools_tokens=tools_tokens)
        if window:
            ctx.adopt(self._anchors.get(turn.session_id))
            ctx.scale = await self._scale(model, messages)
        reserve = answer_tokens(window, self.settings.max_tokens)
        room = Room(window, reserve)
        overflowed = False  # a provider's context_overflow is answered by one forced pass
        call_ids: set[str] = set()  # the tool calls' ids in this turn
        for _ in range(self.max_iterations):
            if window:
                async with contextlib.aclosing(self._fit(ctx, room, model, turn)) as passes:
                    async for event in passes:
                        yield event
                        if isinstance(event, Finished):
                            return
            while True:
                acc = Accumulator()
                usage: Usage | None = None
                reasoning = streamed = False
                overflow: ProviderError | None = None
                raw_estimate = ctx.raw_estimate()
                request = self._request(
                    model, pinned + ctx.messages, acc, room.max_tokens(ctx.size())
                )
                try:
                    async with contextlib.aclosing(request) as events:
                        async for event in events:
                            if isinstance(event, Usage):
                                usage = event
                            else:
                                streamed = True
                            reasoning = reasoning or isinstance(event, ReasoningDelta)
                            yield event
                except ProviderError as exc:
                    if exc.code != "context_overflow" or streamed or overflowed:
                        raise
                    overflow = exc
                if overflow is None:
                    if usage is not None and (
                        scale := measured_scale(usage.prompt_tokens, raw_estimate)
                    ):
                        self._scales[model] = ctx.scale = scale
                    break
                overflowed, compressed = True, False
                async with contextlib.aclosing(
                    self._fit(ctx, room, model, turn, force=True)
                ) as passes:
                    async for event in passes:
                        compressed = compressed or isinstance(event, CompressionCompleted)
                        yield event
                        if isinstance(event, Finished):
                            return
                if not compressed:
                    raise overflow
            calls = acc.tool_calls()
            if not calls:
                if window and usage is not None:
                    self._remember(turn.session_id, ctx, "".join(acc.text), usage, reasoning)
                if acc.finish_reason not in (None, "stop"):  # "length": cut off
                    yield AnswerFinished(acc.finish_reason)
                return
            planned = []
            for call in calls:
                call_id = call["id"]
                # Some servers give every call the same id (`call_0`, "0"), and a run's
                # tool items are told apart by it: a repeat gets an id of its own, in what the
                # model is sent as in what the row shows (invariant 1).
                if not call_id or call_id in call_ids:
                    call_id = f"call_{uuid.uuid4().hex[:24]}"
                call_ids.add(call_id)
                args, problem = parse_arguments(call["arguments"])
                planned.append((call_id, call["name"], args, problem))
            reply = {
                "role": "assistant",
                "content": "".join(acc.text) or None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                    for call_id, name, args, _ in planned
                ],
            }
            ctx.messages.append(reply)
            if usage is not None:
                ctx.note_usage(
                    usage.prompt_tokens, usage.completion_tokens, reply, reasoning=reasoning
                )
            for call_id, name, args, problem in planned:
                yield ToolStarted(call_id, name, args)
                started = time.monotonic()
                if problem is not None:
                    result, is_error = problem, True
                else:
                    result, is_error = await self._run_tool(name, args)
                duration_ms = int((time.monotonic() - started) * 1000)
                yield ToolCompleted(call_id, name, result, is_error, duration_ms)
                ctx.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            # The next step: what the user steered meanwhile joins the conversation here.
            if turn.steer is not None:
                ctx.messages.extend(
                    {"role": "user", "content": text} for text in turn.steer.drain()
                )
        yield Finished(
            "tool_limit_reached",
            reason=(
                f"The model was still calling tools after {self.max_iterations} rounds, "
                "the limit for one turn. Send a message to let it continue."
            ),
        )

    async def _request(
        self,
        model: str,
        messages: list[dict[str, Any]],
        acc: Accumulator,
        max_tokens: int | None,
    ) -> AsyncGenerator[RuntimeEvent, None]:
        """One streamed completion; the HTTP response is closed however this ends."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools is not None:
            # Without tool_choice some servers (llama-cpp-python) ignore the tools entirely.
            body["tools"] = self.tools.schemas
            body["tool_choice"] = "auto"
        idle = self._idle_timeout
        resent = False
        while True:
            if max_tokens is not None:
                body[self._max_tokens_key] = max_tokens
            # Built here, sent on the SDK's HTTP client, parsed with json.loads: the SDK's
            # typed chunks cost half of the loop under load (bench/load_test.py), its request
            # building 0.4-0.9 ms of every first token (bench/README.md). The read timeout
            # stays above the idle timeout, which says it better.
            request = self._http.build_request(
                "POST",
                self._completions_url,
                json=body,
                headers=self._headers,
                timeout=openai.Timeout(idle + 30.0, connect=10.0),
            )
            try:
                async with asyncio.timeout(idle):
                    response = await send_streamed(self._http, request)
                break
            except TimeoutError:
                self._stalled(idle, started=False)
            except Exception as exc:
                if hung_up_unanswered(exc) and not resent:
                    resent = True  # once: one that hangs up on a new connection too is down
                    continue
                if not self._renames_max_tokens(exc, body):
                    self._raise_classified(exc, model, streaming=False, tools="tools" in body)
        done = seen_data = False
        event_name = ""  # the SSE event the next data line belongs to ("" for a message)
        body_lines: list[str] = []  # a body that is not SSE at all (a JSON answer or error)
        lines = sse_lines(response.aiter_bytes(), idle)
        try:
            while True:
                try:
                    line = await anext(lines)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    self._stalled(idle, started=True)
                except Exception as exc:
                    self._raise_classified(exc, model, streaming=True)
                if not line.startswith("data:"):
                    if line.startswith("error:"):  # llama.cpp's server: `error: {...}`, [DONE]
                        self._raise_stream_error(line[6:], response, model)
                    if line.startswith("event:"):
                        event_name = line[6:].strip()
                    elif not line:
                        event_name = ""
                    elif not seen_data and not line.startswith(":") and len(body_lines) < 10_000:
                        body_lines.append(line)
                    continue
                seen_data = True
                payload = line[5:].strip()
                if event_name == "error":  # `event: error` then its data (SSE's named event)
                    self._raise_stream_error(payload, response, model)
                if payload == "[DONE]":
                    done = True
                    await drain(lines)
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError as exc:
                    self._raise_classified(exc, model, streaming=True)
                if (error := error_in(chunk)) is not None:
                    self._raise_classified(
                        stream_error(error, response.request), model, streaming=True
                    )
                try:
                    events = acc.feed(chunk)
                except WrongShape as exc:
                    raise ProviderError(
                        "bad_response",
                        f"The model provider at {self._where()} sent a stream Tether cannot "
                        f"read as Chat Completions chunks: {exc}.",
                    ) from None
                for event in events:
                    yield event
        finally:
            try:
                await lines.aclose()
            finally:  # even when a second cancel lands in the first await
                await response.aclose()
        if not seen_data and not done and body_lines:
            for event in self._unstreamed("\n".join(body_lines), acc, response, model):
                yield event
        elif not seen_data and not done:
            # llama.cpp's server answers a streamed request that does not fit its context
            # with 200 and an empty body (the same request unstreamed is a 400 overflow).
            raise ProviderError(
                "context_overflow",
                f"The model provider at {self._where()} answered with an empty stream, which "
                "is how llama.cpp's server says the request does not fit its context window.",
            )
        for event in acc.flush():
            yield event
        if not acc.saw_completion:
            raise ProviderError(
                "bad_response",
                f"The model provider at {self._where()} ended the stream "
                "without sending any completion data.",
            )
        if acc.finish_reason == "error":  # OpenRouter's, when its error object is missing
            raise ProviderError(
                "bad_response",
                f"The model provider at {self._where()} ended the answer with an error "
                '(finish_reason "error") and did not say which; the text so far is kept.',
            )
        if not done and acc.finish_reason is None:
            # A server that crashed mid-answer closes the stream cleanly: not an answer.
            raise ProviderError(
                "network",
                f"The model provider at {self._where()} closed the stream before the answer "
                "was finished (no finish_reason and no [DONE]); the text so far is kept.",
            )

    def _unstreamed(
        self, text: str, acc: Accumulator, response: Any, model: str
    ) -> list[RuntimeEvent]:
        """A 200 whose body is no SSE stream: a whole answer (from a server or proxy that
        ignores `stream`) is read as one chunk, an error object is the provider's error, and
        anything else (a web page: a wrong --base-url, a proxy's sign-in) is said as it is,
        never taken for llama.cpp's empty stream."""
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if (error := error_in(body)) is not None:
            self._raise_classified(stream_error(error, response.request), model, streaming=True)
        try:
            return acc.feed(completion_as_chunk(body))
        except WrongShape:
            raise ProviderError(
                "bad_response",
                f"The model provider at {self._where()} answered with a body that is not a "
                f"stream of Chat Completions chunks: {text[:300]!r}",
            ) from None

    def _raise_stream_error(self, payload: str, response: Any, model: str) -> NoReturn:
        """An error the provider sent in the stream outside a chunk's `error` field, as a
        JSON object or in plain words: the run ends with the provider's own words."""
        try:
            error = json.loads(payload)
        except ValueError:
            error = payload.strip() or "an error without a message"
        if isinstance(error, dict) and error.get("error") is not None:
            error = error["error"]
        self._raise_classified(stream_error(error, response.request), model, streaming=True)

    def _stalled(self, idle: float, *, started: bool) -> NoReturn:
        what = "stopped sending mid-answer" if started else "sent no answer"
        raise ProviderError(
            "network",
            f"The model provider at {self._where()} {what}: nothing arrived for {idle:g} s "
            "(the stream idle timeout, --stream-idle-timeout); the text so far is kept.",
        )

    # ---- compression -------------------------------------------------------------------------

    async def _fit(
        self, ctx: WorkingContext, room: Room, model: str, turn: TurnInput, force: bool = False
    ) -> AsyncGenerator[RuntimeEvent, None]:
        """Compress `ctx` when the next request passes the threshold of what the window
        leaves after the answer's room (`force`: the provider said it overflowed); ends with
        Finished when even the compressed request does not fit."""
        window, budget = room.window, room.budget
        before = size = ctx.size()
        if not force and (budget is None or size <= budget * self._threshold):
            return
        level1 = ctx.level1_messages()
        too_big = force or (budget is not None and size > budget)
        level2 = ctx.level2_messages() if level1 is None and too_big else None
        if level1 is not None or level2 is not None:
            pass_id = f"cmp_{uuid.uuid4().hex[:12]}"
            yield CompressionStarted(pass_id)
            if level1 is not None:
                request = summary_request(level1, window=window)
                ctx.apply_level1(await self._summary(model, request, window))
                size = ctx.estimate()
                level2 = ctx.level2_messages() if budget is not None and size > budget else None
            if level2 is not None:
                ctx.apply_level2(
                    await self._summary(
                        model,
                        summary_request(
                            level2, window=window, work=True, previous=ctx.work_summary
                        ),
                        window,
                    )
                )
                size = ctx.estimate()
            # What later turns get in place of the turns before this one: the conversation
            # summary alone. The work summary is this turn's own ("work already done in the
            # current turn"); said to a later turn it would make a past task current
            # (invariant 6), and the transcript gives that turn's exchanges in full.
            earlier = ctx.conversation_summary or ""
            yield CompressionCompleted(pass_id, before, size, earlier, turn.turn_id)
        if window is not None and size > window:
            yield Finished(
                "compression_exhausted",
                reason=(
                    f"The next request to the model would need about {size:,} tokens, more than "
                    f"its context window of {window:,} tokens, and compressing the earlier "
                    "conversation cannot make it smaller: the current message and the latest tool "
                    "results alone are too large. Ask for smaller pieces (a shorter excerpt of a "
                    "file, for example) or use a model with a larger context window."
                ),
            )

    def _remember(
        self, session_id: str, ctx: WorkingContext, text: str, usage: Usage, reasoning: bool
    ) -> None:
        """Keep the provider's count of this turn's context for the next turn's first
        request (it applies only if that context starts with exactly these messages)."""
        reply = {"role": "assistant", "content": text} if text.strip() else None
        if reply is not None:
            ctx.messages.append(reply)
        ctx.note_usage(usage.prompt_tokens, usage.completion_tokens, reply, reasoning=reasoning)
        snapshot = ctx.snapshot()
        self._anchors.pop(session_id, None)
        if snapshot is not None:
            self._anchors[session_id] = snapshot
            while len(self._anchors) > MAX_REMEMBERED_SESSIONS:
                self._anchors.pop(next(iter(self._anchors)))

    async def _run_tool(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        if self.tools is None:
            return ("No tools are available: Tether was started without --workspace.", True)
        return await self._tool_runner.run(name, args)

    # ---- attachments -------------------------------------------------------------------------

    def _build_messages(self, turn: TurnInput) -> list[dict[str, Any]]:
        """A copy of the context with attachment parts turned into image/text parts (this
        reads files, so with attachments it runs in a thread)."""
        out: list[dict[str, Any]] = []
        for message in turn.messages:
            content = message.get("content")
            if message.get("role") == "user" and isinstance(content, list):
                message = {
                    **message,
                    "content": [expand_part(part, turn.attachments) for part in content],
                }
            else:
                message = dict(message)
            out.append(message)
        return out
