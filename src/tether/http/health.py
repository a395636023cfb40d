"""`GET /api/health`: readiness and run counts; needs no login (load balancers call it)."""

from __future__ import annotations

import time

from fastapi import APIRouter

from tether import __version__
from tether.http.deps import App

router = APIRouter()


@router.get("/api/health")
async def health(app: App) -> dict:
    runs = app.registry.runs()
    now = time.time()
    return {
        "ok": True,
        "version": __version__,
        "storage": app.storage,
        "replica_id": app.replica_id,
        "runtime": app.engine.runtime.name,
        "model": app.engine.runtime.model,
        "demo": app.engine.runtime.demo,
        "context_window": app.settings.context_window or app.engine.runtime.context_window,
        "context_window_source": "--context-window"
        if app.settings.context_window
        else app.engine.runtime.context_window_source,
        "capabilities": app.engine.runtime.capabilities.names(),
        "active_runs": len(runs),
        "attachable_runs": sum(
            1 for r in runs if app.registry.attachable_stream(r.session_id) == r.stream_id
        ),
        "oldest_run_age_seconds": max((now - r.started_at for r in runs), default=0.0),
        "open_streams": app.stream_slots.total,
    }
