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
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from tether import __version__
from tether.http import auth_routes, errors, health, models, pages, runs, sessions, streams
from tether.http.auth import Authenticator, AuthGate
from tether.http.deps import Services
from tether.http.head import HeadAsGet
from tether.http.hosts import AllowedHosts, HostGuard
from tether.http.limits import BodyLimit
from tether.http.render_pool import RenderPool
from tether.http.slow_clients import BodyDeadline
from tether.http.stream_slots import StreamSlots
from tether.runs import maintenance
from tether.runtimes.base import Runtime
from tether.services import build_services
from tether.settings import Settings

log = logging.getLogger("tether")


def _freeze_startup_heap() -> None:
    """Leave everything alive once the server is ready (modules, the app, the runtime's client)
    out of later garbage collections. Each full collection walked it all again: a stall of the
    event loop of about 100 ms every few seconds under bench/load_test.py, the p99 of every
    request (contract invariant 7)."""
    gc.collect()
    gc.freeze()


def create_app(
    settings: Settings, auth: Authenticator | None = None, runtime: Runtime | None = None
) -> FastAPI:
    """The app. `auth` carries the hashed password; without it, it is loaded from settings
    (auth.PasswordError when the configured password cannot be read). `runtime` is the one
    the command line built before serving; without it, the one settings name."""
    if auth is None:
        auth = Authenticator.from_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = app.state.services = Services(
            **vars(build_services(settings, runtime)),
            stream_slots=StreamSlots(settings.max_streams_per_client),
        )
        engine, store = services.engine, services.store
        recovered = await maintenance.recover(engine)
        if recovered:
            log.warning(
                "marked %d run(s) left open by the previous process as interrupted", recovered
            )
        reclaimer = asyncio.create_task(
            maintenance.reclaim_forever(engine, settings.cancel_reclaim_seconds)
        )
        syncer = (
            asyncio.create_task(services.agent_sync.forever(settings.agent_sync_seconds))
            if services.agent_sync is not None and settings.agent_sync_seconds > 0
            else None
        )
        try:  # warm what the first turn needs (the Hermes sidecar), in the background
            await services.runtime.start()
        except Exception:
            log.exception("the %s runtime could not start warming up", services.runtime.name)
        app.state.renderer = RenderPool()
        _freeze_startup_heap()
        log.info(
            "Tether %s ready (%s runtime): data in %s",
            __version__,
            services.runtime.name,
            settings.data_dir,
        )
        try:
            yield
        finally:
            reclaimer.cancel()
            if syncer is not None:
                syncer.cancel()
            await maintenance.shutdown(engine)
            await services.runtime.aclose()
            app.state.renderer.close()
            store.attach_hub(None)
            await store.aclose()

    app = FastAPI(
        title="Tether",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # the Swagger UI loaded a floating-version script from a CDN
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.auth = auth
    errors.install(app)
    for module in (health, auth_routes, sessions, models, runs, streams, pages):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=str(pages.WEB_ROOT)), name="static")
    # The last added runs first: proxy headers, the Host check, the body deadline, login, the
    # body limit, then HEAD; a request refused by one never reaches those after it.
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthGate, auth=auth)
    app.add_middleware(BodyDeadline, seconds=settings.body_timeout_seconds)
    app.add_middleware(HostGuard, allowed=AllowedHosts.from_settings(settings))  # before login
    if settings.trusted_proxies:  # first of all: the client address and scheme everyone sees
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.trusted_proxies))
    return app
