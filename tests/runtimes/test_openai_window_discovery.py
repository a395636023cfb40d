"""The context window, discovered the way each server family states it (the fake server
answering each family's own endpoint over real HTTP), and shown with its source by
`/api/health`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.runtimes.openai import OpenAIRuntime
from tether.settings import Settings

from fake_openai import FakeOpenAI
from helpers import new_session, running_server, start_turn, wait_idle


@pytest.fixture
def bare() -> Iterator[FakeOpenAI]:
    """A server whose model card says nothing about the context (llama.cpp, Ollama, ...)."""
    with FakeOpenAI(context_length=None) as server:
        yield server


def discovered(fake: FakeOpenAI, tmp_path: Path, **settings: Any) -> tuple[int | None, str | None]:
    rt = OpenAIRuntime(
        Settings(
            runtime="openai",
            base_url=fake.base_url,
            model="fake-model",
            data_dir=tmp_path / "d",
            **settings,
        )
    )

    async def main() -> tuple[int | None, str | None]:
        try:
            window = await rt._context_window("fake-model")
            return window, rt.context_window_source
        finally:
            await rt.aclose()

    return asyncio.run(main())


def test_the_model_card(tmp_path: Path) -> None:
    with FakeOpenAI(context_length=8192) as fake:
        assert discovered(fake, tmp_path) == (8192, "/v1/models")


def test_the_flag_wins(tmp_path: Path) -> None:
    with FakeOpenAI(context_length=8192) as fake:
        assert discovered(fake, tmp_path, context_window=1024) == (1024, "--context-window")


@pytest.mark.parametrize(
    ("route", "answer", "window", "source"),
    [
        (
            ("GET", "/props"),
            {"default_generation_settings": {"n_ctx": 4096, "n_predict": -1}, "total_slots": 1},
            4096,
            "llama.cpp /props",
        ),
        (
            ("GET", "/api/v0/models/fake-model"),
            {"id": "fake-model", "max_context_length": 131072, "loaded_context_length": 8192},
            8192,
            "LM Studio /api/v0/models",
        ),
        (
            ("POST", "/api/show"),
            {
                "parameters": 'stop    "<|eot|>"\nnum_ctx                        6144',
                "model_info": {"llama.context_length": 131072},
            },
            6144,
            "Ollama /api/show",
        ),
        (
            ("POST", "/api/show"),
            {"parameters": "", "model_info": {"qwen2.context_length": 32768}},
            32768,
            "Ollama /api/show",
        ),
    ],
)
def test_each_server_familys_own_endpoint(
    bare: FakeOpenAI, tmp_path: Path, route: tuple[str, str], answer: Any, window: int, source: str
) -> None:
    bare.routes[route] = answer
    assert discovered(bare, tmp_path) == (window, source)
    if route == ("POST", "/api/show"):
        assert bare.hits[-1][2] == {"model": "fake-model"}


def test_nothing_stated_means_unknown(bare: FakeOpenAI, tmp_path: Path) -> None:
    assert discovered(bare, tmp_path) == (None, None)


@pytest.mark.slow
def test_health_shows_the_window_and_its_source(tmp_path: Path, bare: FakeOpenAI) -> None:
    bare.routes[("GET", "/props")] = {"default_generation_settings": {"n_ctx": 2048}}
    with (
        running_server(
            tmp_path / "data", "--runtime", "openai", "--base-url", bare.base_url, "--model", "m"
        ) as srv,
        srv.client() as client,
    ):
        before = client.get("/api/health").json()
        assert (before["context_window"], before["context_window_source"]) == (None, None)
        sid = new_session(client)
        start_turn(client, sid, "hello")  # the window is looked up at the first turn
        wait_idle(client, sid)
        after = client.get("/api/health").json()
        assert (after["context_window"], after["context_window_source"]) == (
            2048,
            "llama.cpp /props",
        )
