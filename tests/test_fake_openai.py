"""Tests for the fake model server itself (tests/fake_openai/), driven by the official
``openai`` SDK and by raw httpx, so the other suites can trust it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager

import httpx
import openai
import pytest

from fake_openai import (
    FakeOpenAI,
    barrier,
    delay,
    drop_connection,
    error,
    hang,
    malformed,
    reasoning,
    reply,
    stream_error,
    text,
    tool_call,
)

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(context_length=4096) as server:
        yield server


@pytest.fixture
def client(fake: FakeOpenAI) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0, timeout=5)
    yield c
    c.close()


def _reasoning_of(delta: object) -> str | None:
    value = getattr(delta, "reasoning_content", None)
    if value is None:
        value = (getattr(delta, "model_extra", None) or {}).get("reasoning_content")
    return value


def test_base_url_and_models(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    assert fake.base_url.startswith("http://127.0.0.1:")
    assert fake.base_url.endswith("/v1")
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    raw = httpx.get(f"{fake.base_url}/models").json()
    assert raw == {
        "object": "list",
        "data": [
            {
                "id": "fake-model",
                "object": "model",
                "created": 0,
                "owned_by": "fake",
                "context_length": 4096,
            }
        ],
    }
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    fake.context_length = 1234
    assert httpx.get(f"{fake.base_url}/models").json()["data"][0]["context_length"] == 1234


def test_streaming_text_and_reasoning(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(reply(reasoning("thinking..."), text("Hello "), text("world")))
    stream = client.chat.completions.create(
        model="fake-model",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, thoughts, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content.append(delta.content)
        if r := _reasoning_of(delta):
            thoughts.append(r)
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(content) == "Hello world"
    assert "".join(thoughts) == "thinking..."
    assert finish == "stop"
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert fake.requests_count == 1
    assert fake.requests[0]["stream"] is True
    assert fake.requests[0]["messages"] == MESSAGES


def test_streamed_tool_call_arguments_reassemble(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    args = {"path": "a.txt", "options": {"lines": [1, 2, 3], "note": "x" * 40}}
    fake.script(
        reply(
            text("Let me look."),
            tool_call("call_1", "read_file", args),
            tool_call("call_2", "list_dir", {"path": "."}),
        )
    )
    calls: dict[int, dict[str, str]] = {}
    fragments = 0
    finish = None
    for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for tc in choice.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            if tc.id:
                slot["id"] = tc.id
            if tc.function and tc.function.name:
                slot["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
                fragments += 1
    assert finish == "tool_calls"
    assert calls[0]["id"] == "call_1"
    assert calls[0]["name"] == "read_file"
    assert json.loads(calls[0]["arguments"]) == args
    assert calls[1] == {"id": "call_2", "name": "list_dir", "arguments": '{"path": "."}'}
    assert fragments >= 4  # arguments really arrive in pieces


def test_non_streaming_reply(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(
        reply(
            reasoning("hmm"),
            text("Hello "),
            text("world"),
            tool_call("call_9", "grep", {"q": "x"}),
            usage={"prompt_tokens": 11},
        ),
        reply(text("plain")),
    )
    resp = client.chat.completions.create(model="m", messages=MESSAGES)
    msg = resp.choices[0].message
    assert msg.content == "Hello world"
    assert _reasoning_of(msg) == "hmm"
    assert msg.tool_calls is not None
    assert msg.tool_calls[0].id == "call_9"
    assert msg.tool_calls[0].function.name == "grep"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"q": "x"}
    assert resp.choices[0].finish_reason == "tool_calls"
    assert resp.usage is not None and resp.usage.prompt_tokens == 11
    assert resp.usage.total_tokens == 11 + resp.usage.completion_tokens

    resp = client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "plain"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.tool_calls is None


def test_default_reply_requests_and_reset(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    for _ in range(2):
        resp = client.chat.completions.create(model="m", messages=MESSAGES)
        assert resp.choices[0].message.content == "ok"
    assert fake.requests_count == 2
    assert fake.last_request["model"] == "m"
    assert fake.request_headers[0]["authorization"] == "Bearer x"
    fake.script("queued")
    assert fake.pending == 1
    fake.reset()
    assert (fake.requests_count, fake.requests, fake.pending, fake.disconnects) == (0, [], 0, 0)
    fake.default_reply = reply(text("changed"))
    assert (
        client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
        == "changed"
    )


@pytest.mark.parametrize(
    ("status", "code", "exc_type"),
    [
        (401, "invalid_api_key", openai.AuthenticationError),
        (404, "model_not_found", openai.NotFoundError),
        (429, "rate_limit_exceeded", openai.RateLimitError),
        (400, "context_length_exceeded", openai.BadRequestError),
        (500, None, openai.InternalServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_error_statuses_map_to_sdk_exceptions(
    fake: FakeOpenAI,
    client: openai.OpenAI,
    status: int,
    code: str | None,
    exc_type: type[openai.APIStatusError],
    stream: bool,
) -> None:
    fake.script(error(status, f"boom {status}", code=code))
    with pytest.raises(exc_type) as info:
        client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
    assert info.value.status_code == status
    assert info.value.code == code
    assert f"boom {status}" in str(info.value)
    raw = httpx.post(f"{fake.base_url}/chat/completions", json={"messages": []})
    assert raw.status_code == 200  # the error was consumed; the default reply follows


def test_error_with_raw_body(fake: FakeOpenAI) -> None:
    fake.script(error(503, {"detail": "overloaded"}, headers={"retry-after": "0"}))
    r = httpx.post(f"{fake.base_url}/chat/completions", json={"messages": []})
    assert r.status_code == 503
    assert r.json() == {"detail": "overloaded"}
    assert r.headers["retry-after"] == "0"


def test_barrier_blocks_until_release(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(reply(text("before "), barrier("b1"), text("after")))
    got: list[str] = []
    done = threading.Event()

    def consume() -> None:
        for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
        done.set()

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    assert fake.wait_reached("b1", timeout=5)
    assert not done.wait(0.2)
    assert got == ["before "]
    fake.release("b1")
    assert done.wait(5)
    worker.join(5)
    assert "".join(got) == "before after"
    assert fake.disconnects == 0


def test_release_before_reach_does_not_block(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.release("early")
    fake.script(reply(barrier("early"), text("through")))
    resp = client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "through"
    assert fake.reached("early")


def test_closing_a_hanging_stream_counts_as_disconnect(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.script(reply(text("partial"), hang()))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    it = iter(stream)
    next(it)  # role chunk
    assert next(it).choices[0].delta.content == "partial"
    closed_at = time.monotonic()
    stream.close()
    assert fake.wait_disconnects(1, timeout=1.0)
    assert fake.disconnects == 1
    assert fake.disconnect_times[0] - closed_at < 1.0


def _streamed(http: httpx.Client, fake: FakeOpenAI) -> AbstractContextManager[httpx.Response]:
    """A streamed chat completion, read as raw HTTP."""
    return http.stream(
        "POST",
        f"{fake.base_url}/chat/completions",
        json={"model": "m", "messages": MESSAGES, "stream": True},
    )


def test_disconnect_while_blocked_on_barrier_with_httpx(fake: FakeOpenAI) -> None:
    fake.script(reply(barrier("never"), text("x")))
    with (
        httpx.Client(timeout=5) as http,
        _streamed(http, fake) as r,
    ):
        assert r.status_code == 200
        assert fake.wait_reached("never", timeout=5)
        closed_at = time.monotonic()
    assert fake.wait_disconnects(1, timeout=1.0)
    assert fake.disconnect_times[0] - closed_at < 1.0


def test_responses_are_sent_without_nagle_delay(fake: FakeOpenAI) -> None:
    """As uvloop, Go and the other servers people run models on, the fake sends each chunk at
    once (TCP_NODELAY). Without it a chunk written while the last is unacknowledged waited
    for the client's delayed ACK (40 ms on Linux): on a connection reused within a fraction
    of a second, every streamed turn's first token came 40 ms late (bench/README.md)."""
    fake.script(reply(text("held"), hang()))
    with (
        httpx.Client(timeout=5) as http,
        _streamed(http, fake) as r,
    ):
        assert r.status_code == 200
        assert fake._server is not None
        connections = list(fake._server.server_state.connections)
        assert connections
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_completed_streams_are_not_disconnects(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    for _ in range(3):
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        client.chat.completions.create(model="m", messages=MESSAGES)
    time.sleep(0.1)
    assert fake.disconnects == 0
    assert fake.requests_count == 6


def test_raw_sse_wire_format(fake: FakeOpenAI) -> None:
    fake.script(reply(text("hi")))
    r = httpx.post(
        f"{fake.base_url}/chat/completions",
        json={
            "model": "m",
            "messages": MESSAGES,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_delay_step(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(reply(text("a"), delay(0.3), text("b")))
    start = time.monotonic()
    resp = client.chat.completions.create(model="m", messages=MESSAGES)
    assert time.monotonic() - start >= 0.3
    assert resp.choices[0].message.content == "ab"


def test_malformed_stream_is_a_bad_response(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(malformed())
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(json.JSONDecodeError):
        list(stream)


def test_drop_connection_mid_stream(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(drop_connection(text("half")))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    seen: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen.append(chunk.choices[0].delta.content)
    assert seen == ["half"]


def test_drop_connection_non_streaming(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(drop_connection())
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=MESSAGES)


def test_in_stream_error_event(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(reply(text("a"), stream_error("upstream died", code="oops")))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match="upstream died"):
        list(stream)


def test_api_key_is_enforced_when_configured() -> None:
    with FakeOpenAI(api_key="sk-right") as fake:
        wrong = openai.OpenAI(base_url=fake.base_url, api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="m", messages=MESSAGES)
        right = openai.OpenAI(base_url=fake.base_url, api_key="sk-right", max_retries=0)
        assert (
            right.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
            == "ok"
        )


def test_stop_cuts_off_hanging_responses_quickly() -> None:
    fake = FakeOpenAI().start()
    fake.script(hang())
    client = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    started = time.monotonic()
    fake.stop()
    assert time.monotonic() - started < 2.0
    with pytest.raises(openai.APIConnectionError):
        list(stream)
