"""`GET /api/models`: what a session may pick (docs/api.md), from the runtime's own list."""

from __future__ import annotations

import unicodedata

from fastapi import APIRouter

from tether.http.deps import App
from tether.http.errors import documented
from tether.http.schemas import ModelListOut
from tether.runtimes.base import ProviderError
from tether.visible_text import BLANK_LETTERS, NOT_SHOWN, shows_something, visible_line

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
    labels = model_labels([*(model["id"] for model in models), body["default"]])
    body["models"] = [{**model, "label": labels[model["id"]]} for model in models]
    body["default_label"] = labels[body["default"]]
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


def model_labels(model_ids: list[str]) -> dict[str, str]:
    """Each id's label, no two alike, so a picker never offers two models as one:
    `model_label`, but ids whose labels meet (`gpt\\u200b-4` beside `gpt-4`) are each
    labelled `escaped_id` (the clean one keeps its plain label). Again while an escaped
    label meets another id's (an id may read like an escape): at most once per id, since
    escaped labels of different ids differ."""
    labels = {model_id: model_label(model_id) for model_id in model_ids}
    while True:
        holders: dict[str, list[str]] = {}
        for model_id, label in labels.items():
            holders.setdefault(label, []).append(model_id)
        met = [model_id for ids in holders.values() if len(ids) > 1 for model_id in ids]
        if not met:
            return labels
        for model_id in met:
            labels[model_id] = escaped_id(model_id)


def escaped_id(model_id: str) -> str:
    """`model_id` with each character that does not show as itself written `\\u{HEX}`
    (`NOT_SHOWN`: controls, format characters such as bidi, zero-width and joiners, marks,
    unassigned; every space but a lone one between two other characters; the blank letters;
    when the id is not NFC, every non-ASCII character, which NFC could draw alike) and `\\`
    as `\\\\`: two ids never escape alike. Copied in `web/js/names.js` (`escapedId`)."""
    nfc = unicodedata.is_normalized("NFC", model_id)
    out = []
    for i, ch in enumerate(model_id):
        inner = 0 < i < len(model_id) - 1
        lone = ch == " " and inner and model_id[i - 1] != " " and model_id[i + 1] != " "
        if ch == "\\":
            out.append("\\\\")
        elif not lone and (
            unicodedata.category(ch) in NOT_SHOWN
            or ch in BLANK_LETTERS
            or (not nfc and ch > "\x7f")
        ):
            out.append(f"\\u{{{ord(ch):04X}}}")
        else:
            out.append(ch)
    return "".join(out)
