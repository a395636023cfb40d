"""The application factory: wires the log, the projections, the runs and the routes.

FastAPI (on Starlette and uvicorn) is the web framework: maintained, async-native, and its
request models give strict validation and an OpenAPI document for free. sse-starlette frames
Server-Sent Events, detects disconnects, applies a write deadline and closes streams on
shutdown, so we do not hand-roll any of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from tether import __version__
from tether.events import VOCABULARY, Vocabulary
from tether.http import (
    account_routes,
    auth_routes,
    errors,
    health,
    models,
    oidc,
    pages,
    runs,
    search,
    server_settings,
    sessions,
    streams,
    transfer,
)
from tether.http.accounts import USER_MODES, AccountAuth, RecordPeer
from tether.http.auth import Authenticator, AuthGate
from tether.http.deps import Services
from tether.http.head import HeadAsGet
from tether.http.hosts import AllowedHosts, HostGuard
from tether.http.limits import BodyLimit
from tether.http.render_pool import RenderPool
from tether.http.slow_clients import BodyDeadline
from tether.http.stream_slots import StreamSlots
from tether.log import StorageError
from tether.runs import leases, maintenance, rotation
from tether.runtimes.base import Runtime
from tether.services import build_services, open_secret
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
    settings: Settings,
    auth: Authenticator | None = None,
    runtime: Runtime | None = None,
    vocabulary: Vocabulary = VOCABULARY,
    oidc_secret: str | None = None,
) -> FastAPI:
    """The app. `auth` carries the hashed password; without it, it is loaded from settings
    (auth.PasswordError when the configured password cannot be read). `runtime` is the one
    the command line built before serving; without it, the one settings name. `vocabulary`:
    the event types it speaks (a test may add its own)."""
    if auth is None:
        auth = Authenticator.from_settings(settings)
    accounts = AccountAuth(settings, open_secret(settings)) if settings.auth in USER_MODES else None
    signin = None
    if settings.auth == "oidc":  # oidc.OIDCConfigError when incomplete
        signin = oidc.OIDCLogin(settings, oidc_secret or oidc.client_secret(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = app.state.services = Services(
            **vars(build_services(settings, runtime, vocabulary)),
            stream_slots=StreamSlots(settings.max_streams_per_client),
        )
        engine, store = services.engine, services.store
        if services.adopt_blobs is not None:  # before anyone reads them through the database
            await services.adopt_blobs()
        if accounts is not None:
            accounts.attach(services.accounts)
            people = await services.accounts.users()
            admins = [u for u in people if u.admin]
            if not people and settings.auth == "accounts":
                log.warning("no users yet: nobody can sign in until `tether users add` adds one")
            if admins:
                store.default_owner = admins[0].user_id
                if await store.claim_unowned(admins[0].user_id):
                    log.info("sessions without an owner now belong to %s", admins[0].username)
        lease = None
        if engine.shared is not None:  # the lease first: a run admitted here must be seen alive
            await engine.shared.renew_lease()
            lease = asyncio.create_task(leases.lease_forever(engine))
        recovered = await maintenance.recover(engine)
        if recovered:
            log.warning(
                "marked %d run(s) left open by the previous process as interrupted", recovered
            )
        await rotation.remove_cut_short(services.sessions, shared=engine.shared is not None)
        reclaimer = asyncio.create_task(
            maintenance.reclaim_forever(engine, settings.cancel_reclaim_seconds)
        )
        removals = (  # `tether users remove` beside this server: its runs stop too
            asyncio.create_task(
                services.controls.stop_removed_forever(
                    services.accounts, settings.heartbeat_seconds
                )
            )
            if accounts is not None
            else None
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
            if removals is not None:
                removals.cancel()
            if syncer is not None:
                syncer.cancel()
            await maintenance.shutdown(engine)
            if lease is not None and engine.shared is not None:
                lease.cancel()
                with contextlib.suppress(StorageError):
                    await engine.shared.release_lease()
            await services.runtime.aclose()
            app.state.renderer.close()
            store.attach_hub(None)
            if accounts is not None:
                accounts.attach(None)
            await services.accounts.aclose()
            await services.aclose_shared()
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
    app.state.accounts = accounts
    app.state.oidc = signin
    errors.install(app)
    for module in (
        health,
        auth_routes,
        account_routes,
        sessions,
        transfer,
        search,
        models,
        server_settings,
        runs,
        streams,
        pages,
    ):
        app.include_router(module.router)
    app.include_router(oidc.router)
    app.mount("/static", StaticFiles(directory=str(pages.WEB_ROOT)), name="static")
    # The last added runs first: proxy headers, the Host check, the body deadline, login, the
    # body limit, then HEAD; a request refused by one never reaches those after it.
    app.add_middleware(HeadAsGet)
    if signin is not None and accounts is not None:  # the sign-in flow's state, for Authlib
        app.add_middleware(oidc.FlowState, secret_key=accounts.flow_secret)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        larger={transfer.IMPORT_PATH: settings.max_import_bytes},
    )
    app.add_middleware(AuthGate, auth=auth, accounts=accounts)
    app.add_middleware(BodyDeadline, seconds=settings.body_timeout_seconds)
    app.add_middleware(HostGuard, allowed=AllowedHosts.from_settings(settings))  # before login
    if settings.trusted_proxies:  # first of all: the client address and scheme everyone sees
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.trusted_proxies))
    if accounts is not None:  # outermost: the peer's own address, before any rewrite
        app.add_middleware(RecordPeer)
    return app
