"""An example Tether runtime: it answers a turn with the user's own words, streamed one word
at a time, and reports its token use. Everything a runtime needs comes from
`tether.runtimes.base`; docs/runtimes.md walks through it."""

from __future__ import annotations

import asyncio

from tether.runtimes.base import Capabilities, Runtime, RuntimeStream, TextDelta, TurnInput, Usage
from tether.settings import Settings


class EchoRuntime(Runtime):
    name = "echo"
    description = "example plugin: answers with what you wrote"
    capabilities = Capabilities(attachments=("text",))

    def __init__(self, settings: Settings):
        self.model = settings.model or "echo-1"

    def accepts(self, mime: str) -> bool:
        return mime.startswith("text/")

    async def stream(self, turn: TurnInput) -> RuntimeStream:
        said = str(turn.messages[-1]["content"]) if turn.messages else ""
        words = f"You said: {said}".split(" ")
        for index, word in enumerate(words):
            yield TextDelta(word if index == 0 else " " + word)
            await asyncio.sleep(0)  # a cancelled turn stops here
        yield Usage(prompt_tokens=len(said.split()), completion_tokens=len(words))

    async def summarize(self, messages: list[dict], model: str | None) -> str:
        return " ".join(str(m.get("content") or "") for m in messages)[:500]
