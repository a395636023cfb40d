"""The application factory: wires the log, the projections, the runs and the routes.

FastAPI (on Starlette and uvicorn) is the web framework: maintained, async-native, and its
request models give strict validation and an OpenAPI document for free. sse-starlette frames
Server-Sent Events, detects disconnects, applies a write deadline and closes streams on
shutdown, so we do not hand-roll any of that.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from tether import __version__
from tether.http import auth_routes, errors, health, pages, runs, sessions, streams
from tether.http.auth import Authenticator, AuthGate
from tether.http.deps import Services
from tether.http.limits import BodyLimit
from tether.http.render_pool import RenderPool
from tether.http.stream_slots import StreamSlots
from tether.log import Hub
from tether.log.attachments import AttachmentStore
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.runs import agent_sync, maintenance
from tether.runs.engine import RunEngine
from tether.runs.queue import QueueService
from tether.runs.registry import RunRegistry
from tether.runs.rotation import Rotator
from tether.runtimes import load_runtime
from tether.sessions.feed import SidebarFeed
from tether.sessions.service import SessionService
from tether.settings import Settings

log = logging.getLogger("tether")


def open_store(settings: Settings) -> SQLiteEventStore:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return SQLiteEventStore(
        settings.database_path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION
    )


def _freeze_startup_heap() -> None:
    """Leave everything alive once the server is ready (modules, the app, the runtime's client)
    out of later garbage collections. Each full collection walked it all again: a stall of the
    event loop of about 100 ms every few seconds under bench/load_test.py, the p99 of every
    request (contract invariant 7)."""
    gc.collect()
    gc.freeze()


def create_app(settings: Settings, auth: Authenticator | None = None) -> FastAPI:
    """The app. `auth` carries the hashed password; without it, it is loaded from settings
    (auth.PasswordError when the configured password cannot be read)."""
    if auth is None:
        auth = Authenticator.from_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = load_runtime(settings)
        store = open_store(settings)
        attachments = AttachmentStore(settings.data_dir / "attachments")
        hub = Hub(asyncio.get_running_loop())
        store.attach_hub(hub)
        feed = SidebarFeed()
        hub.on_batch(feed.on_batch)
        hub.on_deleted(feed.on_deleted)
        registry = RunRegistry(on_change=lambda sid: feed.notify(sid, "run.state"))
        sessions_service = SessionService(store, registry, attachments)
        hub.on_batch(sessions_service.folds.on_batch)
        hub.on_deleted(sessions_service.folds.forget)
        engine = RunEngine(
            store=store,
            sessions=sessions_service,
            registry=registry,
            runtime=runtime,
            attachments=attachments,
        )
        engine.rotator = Rotator(engine, settings)
        engine.queue = QueueService(engine)
        if agent_sync.supported(runtime):
            engine.agent_sync = agent_sync.AgentSync(engine)
        app.state.services = Services(
            settings=settings,
            store=store,
            hub=hub,
            registry=registry,
            sessions=sessions_service,
            feed=feed,
            attachments=attachments,
            engine=engine,
            queue=engine.queue,
            stream_slots=StreamSlots(settings.max_streams_per_client),
        )
        recovered = await maintenance.recover(engine)
        if recovered:
            log.warning(
                "marked %d run(s) left open by the previous process as interrupted", recovered
            )
        reclaimer = asyncio.create_task(
            maintenance.reclaim_forever(engine, settings.cancel_reclaim_seconds)
        )
        syncer = (
            asyncio.create_task(engine.agent_sync.forever(settings.agent_sync_seconds))
            if engine.agent_sync is not None and settings.agent_sync_seconds > 0
            else None
        )
        app.state.renderer = RenderPool()
        _freeze_startup_heap()
        log.info(
            "Tether %s ready (%s runtime): data in %s", __version__, runtime.name, settings.data_dir
        )
        try:
            yield
        finally:
            reclaimer.cancel()
            if syncer is not None:
                syncer.cancel()
            await maintenance.shutdown(engine)
            await runtime.aclose()
            app.state.renderer.close()
            store.attach_hub(None)
            store.close()

    app = FastAPI(
        title="Tether",
        version=__version__,
        lifespan=lifespan,
        docs_url="/api/docs",
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.auth = auth
    errors.install(app)
    for module in (health, auth_routes, sessions, runs, streams, pages):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=str(pages.WEB_ROOT)), name="static")
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # Added last, so it runs first: a refused request never reaches the body limit or a route.
    app.add_middleware(AuthGate, auth=auth)
    return app
