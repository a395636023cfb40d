"""Agent sync's adoption of sessions started in the agent's own client. Layers: the log
(session.created) and the sidebar row. The pass asks the store which Tether sessions exist
before the runtime's scan; a session created meanwhile (a continuation `before_start` made
while the scan ran) must not be created a second time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.log import Draft
from tether.runs.agent_sync import adopt_sessions_started_elsewhere
from tether.runtimes.base import AgentHistory, Capabilities, Runtime

from engine_harness import Harness, harness


class ScanningRuntime(Runtime):
    """An agent whose one session `a1` is bound to Tether session `s_bound`, which another
    pass creates while this runtime's scan runs."""

    name = "scanning"
    capabilities = Capabilities(agent_sync=True)

    def __init__(self) -> None:
        self.model = "scan-1"
        self.h: Harness | None = None

    def agent_history(self) -> AgentHistory:
        return self

    async def agent_changed(self) -> list[str]:
        return []

    async def agent_started_elsewhere(self, exists: Callable[[str], bool]) -> list[dict]:
        assert self.h is not None
        await self.h.store.create_session(  # the concurrent pass, mid-scan
            "s_bound", [Draft("session.created", {"title": "continued", "agent_session_id": "a1"})]
        )
        await asyncio.sleep(0)
        if exists("s_bound"):
            return []
        return [{"agent_session_id": "a1", "title": "from the CLI", "started_at": 1.0}]

    async def agent_adopted(self, agent_session_id: str) -> None:
        return None

    async def agent_owner(self, agent_session_id: str) -> str | None:
        return "s_bound"

    async def bind(self, session_id: str, agent_session_id: str) -> bool:
        return True  # already bound to this very session

    async def agent_news(self, session_id: str, watermark: Any, continued: Any = ()) -> None:
        return None


def test_a_session_created_during_the_scan_is_not_adopted_twice(tmp_path: Path) -> None:
    async def main() -> list[str]:
        runtime = ScanningRuntime()
        async with harness(tmp_path, runtime) as h:
            runtime.h = h
            await adopt_sessions_started_elsewhere(h.sessions, runtime)
            return await h.types("s_bound")

    assert asyncio.run(main()) == ["session.created"]
