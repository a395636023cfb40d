"""`GET/PATCH /api/settings`: the server's defaults for new sessions and sessions without
their own (docs/api.md), kept by `sessions.defaults.ServerDefaults`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tether.errors import Forbidden
from tether.http.accounts import PRINCIPAL
from tether.http.deps import App
from tether.http.errors import documented
from tether.http.schemas import PatchSettings, ServerSettingsOut

router = APIRouter(tags=["settings"])


@router.get(
    "/api/settings",
    summary="The server's defaults",
    response_model=None,
    responses=documented(ok=ServerSettingsOut),
)
async def get_settings(app: App) -> dict:
    """The default model and system prompt in effect, what the settings panel saved, and
    what the command line says (`--model`, `--system-prompt`)."""
    return (await app.sessions.defaults.current()).view(app.engine.runtime.model)


@router.patch(
    "/api/settings",
    summary="Change the server's defaults",
    response_model=None,
    responses=documented(400, 403, 413, ok=ServerSettingsOut),
)
async def patch_settings(app: App, request: Request, body: PatchSettings) -> dict:
    """Save `default_model` and/or `default_system_prompt` (at least one); `null` removes the
    saved value and the command line's applies again; a blank prompt saves "none". Durable at
    once (it survives a restart); sessions with their own model or prompt keep them; every
    run from now on of a session without its own uses the new default. With accounts
    (`--auth accounts|trusted-header|oidc`) only an admin may: they are everyone's defaults
    (403 `forbidden`, nothing saved)."""
    if request.app.state.accounts is not None:
        principal = PRINCIPAL.get()
        if principal is None or not principal.user.admin:
            raise Forbidden("Only an admin changes the server's defaults.")
    await app.sessions.defaults.update(body.model_dump(exclude_unset=True))
    return (await app.sessions.defaults.current()).view(app.engine.runtime.model)
