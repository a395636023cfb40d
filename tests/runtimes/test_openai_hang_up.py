"""Layer: the OpenAI-compatible runtime's requests (runtimes/openai.py, openai_endpoint.py).
A model server closes a kept-alive connection it finds idle (uvicorn, which vLLM and
llama-cpp-python run on, after 5 s); a request sent on it as it closes gets no answer at all,
and the turn ended `network` ("Could not reach the model provider ... ServerDisconnected")
although the server was up: a message sent about 5 s after the last answer could fail so.
Nothing was answered, so the runtime sends the request once more, on a new connection, as a
browser does; a server that hangs up on that one too is still a `network` error.

The model here is a real HTTP server on a socket that closes a connection's second request
unanswered (the fake model cannot: uvicorn answers every request it reads). It hangs up
either way uvicorn does: a clean close (aiohttp's ServerDisconnectedError), or a close with
the request's bytes still unread, which the kernel turns into a reset (ClientOSError,
ECONNRESET). Against a real uvicorn, the reset is the commoner: of 400 turns each sent as its
keep-alive close came, 33 ended `network` on a ClientOSError and none on a clean close."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from runtimes.openai_kit import make_runtime, turn

from tether.runtimes.base import ProviderError, TextDelta
from tether.runtimes.openai import OpenAIRuntime
from tether.runtimes.openai_errors import hung_up_unanswered

CHUNK = {
    "id": "c",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "fake-model",
    "choices": [{"index": 0, "delta": {"content": "answered"}, "finish_reason": "stop"}],
}
COMPLETION = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "fake-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a summary"},
            "finish_reason": "stop",
        }
    ],
}


class HangingUpModel:
    """Answers chat completions (streamed or not) on kept-alive connections, but closes a
    connection without a byte of answer when `hangs_up(nth chat request on it)` says so
    (`resets`: by a reset, as a close with unread bytes is); any other request (the runtime's
    look for the model's window) is 404. `seen`: (connection number, chat request number on
    it) of every chat request read."""

    def __init__(self, hangs_up: Callable[[int], bool], resets: bool = False) -> None:
        self.hangs_up = hangs_up
        self.resets = resets
        self.seen: list[tuple[int, int]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number, nth = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                fields = dict(
                    line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line
                )
                length = int(fields.get(b"content-length", fields.get(b"Content-Length", b"0")))
                raw = await reader.readexactly(length)
                if not head.startswith(b"POST /v1/chat/completions "):
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                body = json.loads(raw)
                nth += 1
                self.seen.append((number, nth))
                if self.hangs_up(nth):
                    if self.resets:  # no FIN: an RST, as for a request left unread
                        linger = struct.pack("ii", 1, 0)
                        writer.get_extra_info("socket").setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, linger
                        )
                        writer.transport.abort()
                    return  # closed below: no status line, no byte
                if body.get("stream"):
                    kind, payload = (
                        b"text/event-stream",
                        b"data: %s\n\ndata: [DONE]\n\n" % (json.dumps(CHUNK).encode()),
                    )
                else:
                    kind, payload = b"application/json", json.dumps(COMPLETION).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                    % (kind, len(payload), payload)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def __enter__(self) -> str:
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop
        ).result(5)
        self.server = server
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def one_turn(rt: OpenAIRuntime) -> None:
    """Stream one turn to its end (or its ProviderError), then close the runtime."""

    async def stream() -> None:
        try:
            async for _ in rt.stream(turn()):
                pass
        finally:
            await rt.aclose()

    asyncio.run(stream())


def sent_again_on_a_new_connection(seen: list[tuple[int, int]]) -> None:
    (kept, first), (again, second), (new, third) = seen
    assert (first, second, third) == (1, 2, 1)
    assert kept == again != new


@pytest.fixture(params=["closed", "reset"])
def second_request_unanswered(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[HangingUpModel, str]]:
    model = HangingUpModel(lambda nth: nth == 2, resets=request.param == "reset")
    with model as url:
        yield model, url


def test_a_turn_sent_on_a_connection_the_server_closed_is_sent_again(
    second_request_unanswered: tuple[HangingUpModel, str], tmp_path: Path
) -> None:
    model, url = second_request_unanswered
    rt = make_runtime(url, tmp_path, None)

    async def two_turns() -> list[list[object]]:
        try:
            return [[e async for e in rt.stream(turn())] for _ in range(2)]
        finally:
            await rt.aclose()

    first, second = asyncio.run(two_turns())
    assert [e for e in first if isinstance(e, TextDelta)] == [TextDelta("answered")]
    assert [e for e in second if isinstance(e, TextDelta)] == [TextDelta("answered")]
    # the second turn's request went out twice: unanswered on the kept connection, then
    # answered on a new one
    sent_again_on_a_new_connection(model.seen)


def test_a_summary_sent_on_a_connection_the_server_closed_is_sent_again(
    second_request_unanswered: tuple[HangingUpModel, str], tmp_path: Path
) -> None:
    model, url = second_request_unanswered
    rt = make_runtime(url, tmp_path, None)
    messages = [{"role": "user", "content": "hello"}]

    async def two_summaries() -> list[str]:
        try:
            return [await rt.summarize(messages, None) for _ in range(2)]
        finally:
            await rt.aclose()

    assert asyncio.run(two_summaries()) == ["a summary", "a summary"]
    sent_again_on_a_new_connection(model.seen)


@pytest.mark.parametrize("resets", [False, True], ids=["closed", "reset"])
def test_a_server_that_never_answers_is_sent_the_request_twice_and_no_more(
    tmp_path: Path, resets: bool
) -> None:
    model = HangingUpModel(lambda nth: True, resets=resets)
    with model as url, pytest.raises(ProviderError) as info:
        one_turn(make_runtime(url, tmp_path, None))
    assert info.value.code == "network"
    assert "Could not reach the model provider" in info.value.message
    assert [nth for _, nth in model.seen] == [1, 1]  # a new connection each
    assert model.seen[0][0] != model.seen[1][0]


def test_a_connection_that_could_not_be_opened_is_no_hang_up(tmp_path: Path) -> None:
    """A refused connection is an aiohttp ClientOSError too (ClientConnectorError), but no
    request went out on it: the turn ends `network` at once, not after a second try."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(ProviderError) as info:
        one_turn(make_runtime(f"http://127.0.0.1:{port}/v1", tmp_path, None))
    assert info.value.code == "network"
    causes: list[BaseException] = []
    cause: BaseException | None = info.value
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    assert any(isinstance(c, aiohttp.ClientConnectorError) for c in causes), causes
    assert not hung_up_unanswered(info.value)
