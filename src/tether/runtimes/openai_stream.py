"""Reading one streamed Chat Completions response: each chunk checked for the shape the
wire format has, text, reasoning and tool-call fragments reassembled, usage and the finish
reason kept. A chunk of any other shape is `WrongShape`, so such a stream ends as an error
instead of as an empty answer (docs/runtimes.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from tether.runtimes.base import ReasoningDelta, RuntimeEvent, TextDelta, Usage


def _get(obj: Any, key: str) -> Any:
    """A field of a streamed chunk, parsed as plain JSON (a dict) or as an SDK object."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _reasoning_of(delta: dict[str, Any]) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str) and value:
            return value
    return None


async def sse_lines(chunks: AsyncIterator[bytes], idle: float) -> AsyncGenerator[str, None]:
    """The lines of an SSE body, from its raw chunks; TimeoutError after `idle` seconds
    without a byte. Lines end in LF, CRLF or CR; a CRLF cut between two reads yields one
    extra empty line, which SSE ignores.

    One deadline for the whole body, moved lazily: a read only notes the time, and a timer
    that finds the last read less than `idle` ago re-arms itself instead of expiring. A
    timeout per line (then per read) scheduled and cancelled a timer each time, a tenth of
    the server's loop with a fast model (bench/floor_stream.py). The caller must resume this
    generator from one task and close it (`aclose`) in that task, as the runtime does; its
    consumer never awaits between lines, so the deadline only runs while a read waits."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    pending = b""
    parts: list[bytes] = []  # reads of a line that has not ended yet, joined when it does
    timer: asyncio.TimerHandle
    async with asyncio.timeout(None) as deadline:

        def check() -> None:
            nonlocal timer
            due = last + idle
            if loop.time() >= due:
                deadline.reschedule(loop.time())  # expires now: the read gets TimeoutError
            else:
                timer = loop.call_at(due, check)

        timer = loop.call_at(last + idle, check)
        try:
            while True:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                last = loop.time()
                if pending and b"\n" not in chunk and b"\r" not in chunk:
                    parts.append(chunk)  # a huge line: joined once, not once per read
                    continue
                if parts:
                    pending, parts = b"".join([pending, *parts]), []
                data = pending + chunk if pending else chunk
                lines = data.splitlines()
                pending = lines.pop() if lines and not data.endswith((b"\n", b"\r")) else b""
                for line in lines:
                    yield line.decode("utf-8", "replace")
        finally:
            timer.cancel()
    if parts:
        pending = b"".join([pending, *parts])
    if pending:
        yield pending.decode("utf-8", "replace")


DRAIN_SECONDS = 0.1  # how long the end of a body may take to follow its [DONE]


async def drain(lines: AsyncIterator[str]) -> None:
    """Read what follows `[DONE]` (normally only the end of the chunked body) so that the
    HTTP client keeps the connection for the next request: a response closed before its end
    costs its connection, so every turn opened a new one (a TLS handshake with a remote
    provider). A provider that sends more lines, or keeps the body open, is cut as before."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for line in lines:
                if line:
                    return


class WrongShape(ValueError):
    """A streamed chunk that is not a Chat Completions chunk (the reason says what is off)."""


def _check_shape(chunk: Any) -> None:
    """Refuse what a Chat Completions stream never sends, so a stream of the wrong shape ends
    as an error instead of as an empty answer."""
    if not isinstance(chunk, dict):
        raise WrongShape(f"a chunk is a JSON {type(chunk).__name__}, not an object")
    choices = chunk.get("choices")
    if choices is None and chunk.get("usage") is None and "choices" not in chunk:
        raise WrongShape("a chunk has neither 'choices' nor 'usage'")
    if choices is not None and not isinstance(choices, list):
        raise WrongShape("'choices' is not a list")
    for choice in choices or []:
        if not isinstance(choice, dict):
            raise WrongShape("a choice is not an object")
        delta = choice.get("delta")
        if delta is None and choice.get("finish_reason") is None:
            raise WrongShape("a choice has no 'delta' (is this a non-streaming answer?)")
        if delta is not None and not isinstance(delta, dict):
            raise WrongShape("a choice's 'delta' is not an object")
        fields = delta or {}
        for key in ("content", "refusal", "reasoning_content", "reasoning"):
            value = fields.get(key)
            if value is None or isinstance(value, str):
                continue
            if (
                key == "content"
                and isinstance(value, list)
                and all(isinstance(p, dict) for p in value)
            ):
                continue  # Mistral's content parts
            raise WrongShape(f"'delta.{key}' is not a string")
        calls = fields.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list) and all(isinstance(c, dict) for c in calls)
        ):
            raise WrongShape("'delta.tool_calls' is not a list of objects")
    usage = chunk.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise WrongShape("'usage' is not an object")


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _tag_start_at_end(data: str, tag: str) -> int:
    """How many of `data`'s last characters could begin `tag` (a tag cut between chunks)."""
    for size in range(min(len(tag) - 1, len(data)), 0, -1):
        if tag.startswith(data[-size:]):
            return size
    return 0


class ThinkTags:
    """Splits reasoning a model writes into its content as `<think>...</think>` (Qwen3, QwQ,
    DeepSeek-R1 served without a reasoning parser: vLLM without --reasoning-parser, llama.cpp
    with --reasoning-format none, LM Studio, older Ollama) from the answer, so the thoughts
    are shown and kept as reasoning, not as the answer the next request sends back. Only a
    `<think>` that opens the content (after whitespace) counts; the tags may be cut anywhere
    between chunks, so a tail that may begin one is held until the next chunk (`flush`
    gives it back at the stream's end)."""

    def __init__(self) -> None:
        self.state = "start"  # start: only whitespace so far; think; after: the tag closed; text
        self.held = ""

    def feed(self, content: str) -> list[TextDelta | ReasoningDelta]:
        data, self.held = self.held + content, ""
        if self.state == "start":
            opened = data.lstrip()
            if opened.startswith(THINK_OPEN):
                self.state, data = "think", opened[len(THINK_OPEN) :]
            elif THINK_OPEN.startswith(opened):  # whitespace, or a tag not whole yet
                self.held = data
                return []
            else:
                self.state = "text"
                return [TextDelta(data)]
        out: list[TextDelta | ReasoningDelta] = []
        if self.state == "think":
            end = data.find(THINK_CLOSE)
            if end < 0:
                keep = _tag_start_at_end(data, THINK_CLOSE)
                if keep:
                    data, self.held = data[:-keep], data[-keep:]
                return [ReasoningDelta(data)] if data else []
            if end:
                out.append(ReasoningDelta(data[:end]))
            self.state, data = "after", data[end + len(THINK_CLOSE) :]
        if self.state == "after":  # the blank lines between the thoughts and the answer
            data = data.lstrip()
            if not data:
                return out
            self.state = "text"
        out.append(TextDelta(data))
        return out

    def flush(self) -> list[TextDelta | ReasoningDelta]:
        held, self.held = self.held, ""
        if not held:
            return []
        return [ReasoningDelta(held) if self.state == "think" else TextDelta(held)]


def _part_text(value: Any) -> str:
    """A part's words: a string, or a list of `{type: "text", text}` parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _content_parts(parts: list[dict[str, Any]]) -> list[TextDelta | ReasoningDelta]:
    """Content sent as a list of parts (Mistral's API, for its magistral models: `thinking`
    parts, then `text` ones); parts of other types (references, ...) carry no words."""
    out: list[TextDelta | ReasoningDelta] = []
    for part in parts:
        kind = part.get("type")
        if kind == "thinking" and (words := _part_text(part.get("thinking"))):
            out.append(ReasoningDelta(words))
        elif kind == "text" and (words := _part_text(part.get("text"))):
            out.append(TextDelta(words))
    return out


class Accumulator:
    """What one streamed response said: text, tool calls reassembled by index, usage, and
    the finish reason (None until the provider says the answer is complete)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self._slot_for: dict[Any, int] = {}
        self.saw_completion = False
        self.finish_reason: str | None = None
        self._think = ThinkTags()

    def feed(self, chunk: Any) -> list[RuntimeEvent]:
        """The events of one parsed chunk. Once `_check_shape` passed, every level down to
        the delta's fields is a plain dict, list or string, so they are read with `dict.get`
        (this runs once per chunk, thousands of times per answer). A chunk with `choices:
        null`, or a `data: null` keep-alive, is empty: such chunks come in healthy streams
        (vLLM, gateways), and a stream of nothing else is still no answer."""
        if chunk is None:
            return []
        _check_shape(chunk)
        events: list[RuntimeEvent] = []
        usage = chunk.get("usage")
        if usage is not None:
            self.saw_completion = True
            events.append(
                Usage(
                    int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
                )
            )
        for choice in chunk.get("choices") or ():
            if finish := choice.get("finish_reason"):
                self.finish_reason = str(finish)
                self.saw_completion = True
            delta = choice.get("delta")
            if delta is None:
                continue
            self.saw_completion = True
            if reasoning := _reasoning_of(delta):
                events.append(ReasoningDelta(reasoning))
            content = delta.get("content") or delta.get("refusal")  # strings or None
            if isinstance(content, list):
                events.extend(self._split(_content_parts(content)))
            elif content:
                if self._think.state == "text":
                    self.text.append(content)
                    events.append(TextDelta(content))
                else:
                    events.extend(self._split(self._think.feed(content)))
            for fragment in delta.get("tool_calls") or ():
                self._add_fragment(fragment)
        return events

    def flush(self) -> list[RuntimeEvent]:
        """What the stream's end settles: a held tail that did not begin a tag after all."""
        return self._split(self._think.flush())

    def _split(self, events: list[TextDelta | ReasoningDelta]) -> list[RuntimeEvent]:
        self.text.extend(e.text for e in events if isinstance(e, TextDelta))
        return list(events)

    def _add_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        call_id = fragment.get("id")
        function = fragment.get("function")
        key = self._slot_for.get(index)
        # Some servers reuse one index for several complete calls: a new id starts a new call.
        if key is None or (call_id and self.calls[key]["id"] and call_id != self.calls[key]["id"]):
            key = len(self.calls)
            self._slot_for[index] = key
            self.calls[key] = {"id": "", "name": "", "arguments": ""}
        slot = self.calls[key]
        if call_id:
            slot["id"] = call_id
        name = _get(function, "name") if function is not None else None
        if name:
            slot["name"] = name
        arguments = _get(function, "arguments") if function is not None else None
        if arguments:
            slot["arguments"] += arguments if isinstance(arguments, str) else json.dumps(arguments)

    def tool_calls(self) -> list[dict[str, str]]:
        return [self.calls[k] for k in sorted(self.calls)]


def completion_as_chunk(body: Any) -> dict[str, Any]:
    """A whole Chat Completions answer (a `chat.completion`, which a server or proxy that
    ignores `stream` sends) as the one chunk that says the same, for `Accumulator.feed`."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not all(
        isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices
    ):
        raise WrongShape("the body is neither a stream nor a Chat Completions answer")
    deltas = []
    for choice in choices:
        delta = dict(choice["message"])
        calls = delta.get("tool_calls")
        if isinstance(calls, list):  # a whole answer's calls have no index: their order is it
            delta["tool_calls"] = [
                {**call, "index": index} if isinstance(call, dict) else call
                for index, call in enumerate(calls)
            ]
        deltas.append({"delta": delta, "finish_reason": choice.get("finish_reason")})
    return {"choices": deltas, "usage": body.get("usage")}


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """`(args, problem)`: the arguments as a dict, or a problem to report as the result."""
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return {"raw_arguments": raw[:2000]}, (
            f"Invalid JSON arguments ({exc}); send the arguments as one JSON object."
        )
    if not isinstance(value, dict):
        return {"raw_arguments": raw[:2000]}, (
            f"Invalid JSON arguments: expected a JSON object, got {type(value).__name__}."
        )
    return value, None
