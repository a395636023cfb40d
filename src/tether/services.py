"""The one place the services are wired: the log, its live fan-out, the run registry, the
session layer, the run engine and what runs between turns. The app (`http/app.py`) and the
engine tests (`tests/runs/engine_harness.py`) both build them here, so what the tests drive
is what the server runs. Dependencies point one way (docs/architecture.md): this module is
above the runs and everything under them, below the HTTP layer, and nothing below imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from tether.events import VOCABULARY, Vocabulary, new_id
from tether.log import Hub, StorageError
from tether.log.attachments import AttachmentStore, BlobStore
from tether.log.checked import CheckedStore
from tether.log.ownership import OwnedStore
from tether.log.private import private_dir
from tether.log.shared import (
    FileSettings,
    LoginLimits,
    MemoryLoginLimits,
    SavedSettings,
    file_secret,
)
from tether.log.sqlite import SQLiteEventStore
from tether.log.sqlite_accounts import SQLiteAccountStore
from tether.log.store import AccountStore, EventStore, SharedLog
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.runs import agent_sync
from tether.runs.controls import RunControls
from tether.runs.engine import RunEngine
from tether.runs.queue import QueueService
from tether.runs.registry import RunRegistry
from tether.runs.rotation import Rotator
from tether.runtimes import load_runtime
from tether.runtimes.base import Runtime
from tether.sessions.defaults import KEYS, SYSTEM_PROMPT_MAX_CHARS, ServerDefaults
from tether.sessions.feed import SidebarFeed
from tether.sessions.search import SEARCH_FOLD_VERSION, search_change
from tether.sessions.service import SessionService
from tether.sessions.transfer.importer import Importer
from tether.settings import Settings


@dataclass
class Services:
    settings: Settings
    vocabulary: Vocabulary
    runtime: Runtime
    store: OwnedStore  # every layer reads and writes the log through the ownership filter
    accounts: AccountStore
    hub: Hub
    registry: RunRegistry
    sessions: SessionService
    feed: SidebarFeed
    attachments: BlobStore
    login_limits: LoginLimits
    engine: RunEngine
    controls: RunControls  # Stop, steer and answers, through any replica
    queue: QueueService
    agent_sync: agent_sync.AgentSync | None
    importer: Importer
    replica_id: str  # this process, among the replicas sharing a database (GET /api/health)
    # Attachment bytes left in the data directory by an earlier version, to copy into the
    # database at start (PostgreSQL only; log/pg_blobs.py).
    adopt_blobs: Callable[[], Awaitable[int]] | None

    @property
    def storage(self) -> str:
        return "postgresql" if self.settings.database_url else "sqlite"

    async def aclose_shared(self) -> None:
        """Close what `open_shared` opened (with PostgreSQL, one pool between them)."""
        await self.login_limits.aclose()
        await self.sessions.defaults.saved.aclose()
        await self.attachments.aclose()


def open_store(
    settings: Settings, replica_id: str | None = None, vocabulary: Vocabulary = VOCABULARY
) -> CheckedStore:
    """The log: PostgreSQL with `--database-url` (several replicas may share it), else the
    embedded SQLite file in the data directory; behind the payload check every service
    write goes through."""
    try:
        private_dir(settings.data_dir)
    except OSError as exc:  # under a file, on a path the system refuses: one clear line
        reason = exc.strerror or str(exc)
        raise StorageError(
            f"Cannot make the data directory {settings.data_dir}: {reason}"
        ) from None
    backend: EventStore
    if settings.database_url:
        try:  # the extra is optional: only a PostgreSQL deployment installs the driver
            from tether.log.postgres import PostgresEventStore
        except ImportError as exc:
            raise StorageError(
                f"--database-url needs the PostgreSQL driver: pip install 'tether[postgres]' "
                f"({exc})"
            ) from None
        backend = PostgresEventStore(
            settings.database_url,
            index_fold=fold_row,
            index_version=SIDEBAR_FOLD_VERSION,
            replica_id=replica_id,
            pool_size=settings.database_pool_size,
            search_fold=search_change,
            search_version=SEARCH_FOLD_VERSION,
        )
    else:
        backend = SQLiteEventStore(
            settings.database_path,
            index_fold=fold_row,
            index_version=SIDEBAR_FOLD_VERSION,
            search_fold=search_change,
            search_version=SEARCH_FOLD_VERSION,
        )
    return CheckedStore(backend, vocabulary)


def open_accounts(settings: Settings) -> AccountStore:
    """The users and tokens, in the database of the log (open the log first: it migrates)."""
    if settings.database_url:
        from tether.log.pg_accounts import PostgresAccountStore  # the driver: see open_store

        return PostgresAccountStore(settings.database_url)
    return SQLiteAccountStore(settings.database_path)


def open_secret(settings: Settings) -> str:
    """The cookie-signing secret: in the database with `--database-url` (every replica signs
    and checks with the same one), else `<data_dir>/secret_key`."""
    if settings.database_url:
        from tether.log.pg_shared import shared_secret  # the driver: see open_store

        return shared_secret(settings.database_url)
    return file_secret(settings.data_dir)


@dataclass(frozen=True, slots=True)
class Shared:
    limits: LoginLimits
    settings: SavedSettings
    blobs: BlobStore
    adopt_blobs: Callable[[], Awaitable[int]] | None


def open_shared(settings: Settings) -> Shared:
    """The login failures, the settings panel's defaults and the attachment bytes: with
    `--database-url` in the database (log/pg_shared.py, log/pg_blobs.py, one small pool), so
    replicas with data directories of their own agree; else this process's memory and its
    data directory."""
    root = settings.data_dir / "attachments"
    if settings.database_url:
        from tether.log.pg_blobs import PostgresBlobStore  # the driver: see open_store
        from tether.log.pg_shared import LazyPool, PostgresLoginLimits, PostgresSettings

        pool = LazyPool(settings.database_url)
        blobs = PostgresBlobStore(pool, root, cache_bytes=settings.attachment_cache_bytes)
        return Shared(PostgresLoginLimits(pool), PostgresSettings(pool), blobs, blobs.adopt_local)
    return Shared(
        MemoryLoginLimits(), FileSettings(settings.data_dir, KEYS), AttachmentStore(root), None
    )


def build_services(
    settings: Settings, runtime: Runtime | None = None, vocabulary: Vocabulary = VOCABULARY
) -> Services:
    """Everything wired, on the running event loop. `runtime` defaults to the one
    `settings.runtime` names; tests pass their own, and may pass a larger `vocabulary`."""
    runtime = runtime if runtime is not None else load_runtime(settings)
    replica_id = new_id("replica")
    checked = open_store(settings, replica_id, vocabulary)
    store = OwnedStore(checked)
    accounts = open_accounts(settings)
    shared = open_shared(settings)
    attachments = shared.blobs
    hub = Hub(asyncio.get_running_loop())
    store.attach_hub(hub)
    feed = SidebarFeed()
    hub.on_batch(feed.on_batch)
    hub.on_deleted(feed.on_deleted)
    registry = RunRegistry(on_change=lambda sid: feed.notify(sid, "run.state"))
    defaults = ServerDefaults(
        shared.settings,
        settings.system_prompt,
        system_prompt_max_chars=SYSTEM_PROMPT_MAX_CHARS,
    )
    sessions = SessionService(store, registry, attachments, defaults)
    hub.on_batch(sessions.folds.on_batch)
    hub.on_deleted(sessions.forget)
    # What runs between turns acts on the sessions, so it exists before the engine that calls
    # it; the queue acts on the engine (it starts turns), so it comes after. Nothing is
    # handed over late.
    history = runtime.agent_history()
    syncer = agent_sync.AgentSync(sessions, history) if history is not None else None
    engine = RunEngine(
        store=store,
        sessions=sessions,
        registry=registry,
        runtime=runtime,
        attachments=attachments,
        rotator=Rotator(sessions, runtime, settings),
        agent_sync=syncer,
        people=accounts if settings.auth != "password" else None,
    )
    if settings.database_url:  # the PostgreSQL backend: leases and takeover (runs/leases.py)
        engine.shared = cast(SharedLog, checked.backend)
    # The log is shared with other replicas (PostgreSQL): a control for a run another
    # replica runs is recorded in the log, and heard by that run's owner.
    controls = RunControls(
        store=store, sessions=sessions, registry=registry, shared_log=bool(settings.database_url)
    )
    hub.on_batch(controls.on_events)
    queue = QueueService(engine)
    return Services(
        settings=settings,
        vocabulary=vocabulary,
        runtime=runtime,
        store=store,
        accounts=accounts,
        hub=hub,
        registry=registry,
        sessions=sessions,
        feed=feed,
        attachments=attachments,
        login_limits=shared.limits,
        engine=engine,
        controls=controls,
        queue=queue,
        agent_sync=syncer,
        replica_id=replica_id,
        importer=Importer(sessions, engine.shared),
        adopt_blobs=shared.adopt_blobs,
    )
