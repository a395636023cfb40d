"""What the OpenAI runtime's tests share: a turn, a runtime pointed at the fake model, and
a driver that streams a turn to its end in a fresh event loop (the fixtures:
tests/runtimes/conftest.py)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from tether.runtimes.base import RuntimeEvent, TurnInput, Usage
from tether.runtimes.openai import OpenAIRuntime
from tether.settings import Settings

USER = [{"role": "user", "content": "hi"}]
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def make_runtime(
    base_url: str, tmp_path: Path, workspace: Path | None, **kwargs: Any
) -> OpenAIRuntime:
    settings = Settings(
        runtime="openai",
        base_url=base_url,
        model="fake-model",
        workspace=workspace,
        data_dir=tmp_path / "data",
        api_key_env=kwargs.pop("api_key_env", "TETHER_TEST_OPENAI_KEY"),
    )
    return OpenAIRuntime(settings, **kwargs)


def turn(messages: list[dict[str, Any]] | None = None, **kwargs: Any) -> TurnInput:
    return TurnInput("s1", "st1", "t1", USER if messages is None else messages, **kwargs)


def run(
    rt: OpenAIRuntime, t: TurnInput | None = None, into: list[RuntimeEvent] | None = None
) -> list[RuntimeEvent]:
    """Drive `stream()` to the end in a fresh event loop; `into` keeps events seen before an
    error."""
    events: list[RuntimeEvent] = [] if into is None else into

    async def main() -> None:
        try:
            async for event in rt.stream(t or turn()):
                events.append(event)
        finally:
            await rt.aclose()

    asyncio.run(main())
    return events


def content_events(events: list[RuntimeEvent]) -> list[RuntimeEvent]:
    return [e for e in events if not isinstance(e, Usage)]
