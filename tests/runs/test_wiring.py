"""Layer: the wiring (`tether.services.build_services`), which the app and the engine harness
share. The engine gets what runs between turns when it is built, as the protocols it
declares: rotation and agent sync act on the sessions, so they never reach back into the
engine, and nothing is handed over after construction."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

from tether.runs import maintenance
from tether.runs.agent_sync import AgentSync
from tether.runs.engine import RunEngine
from tether.runs.rotation import Rotator
from tether.runtimes.base import AgentHistory, AgentNews, Capabilities
from tether.runtimes.demo import DemoRuntime
from tether.services import build_services
from tether.settings import Settings

from engine_harness import NothingElsewhere


class KeepsHistory(NothingElsewhere, DemoRuntime):
    """The demo, with an agent that keeps its own history (holding nothing new): agent sync
    is wired for it, and asked before each turn."""

    capabilities = Capabilities(agent_sync=True)

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.asked: list[str] = []

    def agent_history(self) -> AgentHistory:
        return self

    async def agent_news(
        self, session_id: str, watermark: int, continued: Any = ()
    ) -> AgentNews | None:
        self.asked.append(session_id)
        return AgentNews(watermark)

    async def agent_changed(self) -> list[str]:
        return []


RUNS = Path(__file__).parents[2] / "src/tether/runs"


def test_the_engine_is_built_with_its_between_turn_collaborators(tmp_path: Path) -> None:
    async def main() -> None:
        for runtime_class, syncs in ((DemoRuntime, False), (KeepsHistory, True)):
            settings = Settings(data_dir=tmp_path / runtime_class.__name__)
            runtime = runtime_class(settings)
            services = build_services(settings, runtime)
            try:
                engine = services.engine
                assert isinstance(engine.rotator, Rotator)
                assert engine.rotator.sessions is services.sessions
                assert engine.agent_sync is services.agent_sync
                assert isinstance(engine.agent_sync, AgentSync) is syncs
                assert services.queue.engine is engine
                session = await services.sessions.create("wired")
                await engine.start(session["session_id"], "hello")
                for _ in range(1000):
                    if not services.registry.busy(session["session_id"]):
                        break
                    await asyncio.sleep(0.01)
                if isinstance(runtime, KeepsHistory):  # synced before the turn was admitted
                    assert runtime.asked == [session["session_id"]]
            finally:
                await maintenance.shutdown(services.engine, grace=1)
                await services.store.aclose()

    asyncio.run(main())
    assert not hasattr(RunEngine, "connect")


def test_what_runs_between_turns_does_not_import_the_engine() -> None:
    for module in ("rotation.py", "agent_sync.py"):
        tree = ast.parse((RUNS / module).read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "tether.runs.engine" not in imported, module
