"""`GET /api/models`: what a session may pick (docs/api.md), from the runtime's own list."""

from __future__ import annotations

from fastapi import APIRouter

from tether.http.deps import App
from tether.http.errors import documented
from tether.http.schemas import ModelListOut
from tether.runtimes.base import ProviderError

router = APIRouter(tags=["models"])


@router.get(
    "/api/models",
    summary="Models a session may use",
    response_model=None,
    responses=documented(ok=ModelListOut),
)
async def list_models(app: App) -> dict:
    """The runtime's models (for `openai`, the endpoint's own `GET /v1/models`, cached
    briefly) and the server default. An endpoint that cannot say answers 200 with the default
    alone and `error: {code, message}`: the picker still works, never a 5xx."""
    runtime = app.engine.runtime
    defaults = await app.sessions.defaults.current()
    body: dict = {
        "default": defaults.model or runtime.model,
        "default_system_prompt": defaults.system_prompt,
    }
    try:
        body["models"] = await runtime.list_models()
    except ProviderError as exc:
        body["models"] = [{"id": body["default"]}]
        body["error"] = {"code": exc.code, "message": exc.message}
    return body
