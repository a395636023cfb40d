"""`GET /api/models`: what a session may pick (docs/api.md), from the runtime's own list."""

from __future__ import annotations

from fastapi import APIRouter

from tether.http.deps import App
from tether.http.errors import documented
from tether.http.schemas import ModelListOut
from tether.runtimes.base import ProviderError
from tether.visible_text import shows_something, visible_line

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
        models = await runtime.list_models()
    except ProviderError as exc:
        models = [{"id": body["default"]}]
        body["error"] = {"code": exc.code, "message": exc.message}
    body["models"] = [{**model, "label": model_label(model["id"])} for model in models]
    body["default_label"] = model_label(body["default"])
    return body


def model_label(model_id: str) -> str:
    """What the page shows for a model: its id as visible text (a hostile endpoint may list
    an id with a bidi override or zero-width characters, to pass for another model). The id
    itself is what a session stores and the endpoint gets back, unchanged; an id with nothing
    visible is shown as its code points."""
    label = visible_line(model_id)
    if shows_something(label):
        return label
    return " ".join(f"U+{ord(ch):04X}" for ch in model_id) or "(no name)"
