"""The one place the services are wired: the log, its live fan-out, the run registry, the
session layer, the run engine and what runs between turns. The app (`http/app.py`) and the
engine tests (`tests/runs/engine_harness.py`) both build them here, so what the tests drive
is what the server runs. Dependencies point one way (docs/architecture.md): this module is
above the runs and everything under them, below the HTTP layer, and nothing below imports it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tether.log import Hub
from tether.log.attachments import AttachmentStore
from tether.log.ownership import OwnedStore
from tether.log.private import private_dir
from tether.log.sqlite import SQLiteEventStore
from tether.log.sqlite_accounts import SQLiteAccountStore
from tether.log.store import AccountStore, EventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.runs import agent_sync
from tether.runs.engine import RunEngine
from tether.runs.queue import QueueService
from tether.runs.registry import RunRegistry
from tether.runs.rotation import Rotator
from tether.runtimes import load_runtime
from tether.runtimes.base import Runtime
from tether.sessions.feed import SidebarFeed
from tether.sessions.service import SessionService
from tether.settings import Settings


@dataclass
class Services:
    settings: Settings
    runtime: Runtime
    store: OwnedStore  # every layer reads and writes the log through the ownership filter
    accounts: AccountStore
    hub: Hub
    registry: RunRegistry
    sessions: SessionService
    feed: SidebarFeed
    attachments: AttachmentStore
    engine: RunEngine
    queue: QueueService
    agent_sync: agent_sync.AgentSync | None


def open_store(settings: Settings) -> EventStore:
    private_dir(settings.data_dir)
    return SQLiteEventStore(
        settings.database_path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION
    )


def open_accounts(settings: Settings) -> AccountStore:
    """The users and tokens, in the database of the log (open the log first: it migrates)."""
    return SQLiteAccountStore(settings.database_path)


def build_services(settings: Settings, runtime: Runtime | None = None) -> Services:
    """Everything wired, on the running event loop. `runtime` defaults to the one
    `settings.runtime` names; tests pass their own."""
    runtime = runtime if runtime is not None else load_runtime(settings)
    store = OwnedStore(open_store(settings))
    accounts = open_accounts(settings)
    attachments = AttachmentStore(settings.data_dir / "attachments")
    hub = Hub(asyncio.get_running_loop())
    store.attach_hub(hub)
    feed = SidebarFeed()
    hub.on_batch(feed.on_batch)
    hub.on_deleted(feed.on_deleted)
    registry = RunRegistry(on_change=lambda sid: feed.notify(sid, "run.state"))
    sessions = SessionService(store, registry, attachments, settings.system_prompt)
    hub.on_batch(sessions.folds.on_batch)
    hub.on_deleted(sessions.folds.forget)
    engine = RunEngine(
        store=store, sessions=sessions, registry=registry, runtime=runtime, attachments=attachments
    )
    queue = QueueService(engine)
    history = runtime.agent_history()
    syncer = agent_sync.AgentSync(engine, history) if history is not None else None
    engine.connect(rotator=Rotator(engine, settings), queue=queue, agent_sync=syncer)
    return Services(
        settings=settings,
        runtime=runtime,
        store=store,
        accounts=accounts,
        hub=hub,
        registry=registry,
        sessions=sessions,
        feed=feed,
        attachments=attachments,
        engine=engine,
        queue=queue,
        agent_sync=syncer,
    )
