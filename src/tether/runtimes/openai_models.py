"""What an OpenAI-compatible server says about a model's context window, asked the way each
server family answers (docs/runtimes.md):

1. ``GET {base}/models/{model}``, then the ``GET {base}/models`` list: ``context_length``,
   ``context_window``, ``max_context_length`` or vLLM's ``max_model_len`` (also under
   ``top_provider`` / ``meta``: OpenRouter and others);
2. llama.cpp's server: ``GET {root}/props``, ``default_generation_settings.n_ctx``;
3. LM Studio: ``GET {root}/api/v0/models/{model}``, ``loaded_context_length`` (else
   ``max_context_length``);
4. Ollama: ``POST {root}/api/show``, ``num_ctx`` in ``parameters`` (the context the server
   runs the model with), else ``model_info["<arch>.context_length"]`` (what it was trained
   for: an upper bound, since Ollama may run it with less).

``{root}`` is the base URL without its trailing ``/v1``. The first answer wins; a server that
cannot be reached raises `Unreachable`, so the lookup is tried again later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import openai

from tether.runtimes.openai_errors import connection_failure

WINDOW_KEYS = ("context_length", "context_window", "max_context_length", "max_model_len")
TIMEOUT = httpx.Timeout(15.0, connect=5.0)


class Unreachable(Exception):
    """The server could not be reached: nothing is known, and nothing should be remembered."""


@dataclass(frozen=True, slots=True)
class Window:
    tokens: int
    source: str  # shown by /api/health as context_window_source


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return int(value)
    return None


def window_of_card(card: Any) -> int | None:
    """The context length a model card states, if any (OpenRouter, LM Studio, vLLM, ...)."""
    data = card.model_dump() if hasattr(card, "model_dump") else card
    if not isinstance(data, dict):
        return None
    for where in (data, data.get("top_provider"), data.get("meta")):
        if isinstance(where, dict):
            for key in WINDOW_KEYS:
                if (tokens := _positive_int(where.get(key))) is not None:
                    return tokens
    return None


def _root(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _llama_cpp(body: Any, model: str) -> int | None:
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    if isinstance(settings, dict):
        return _positive_int(settings.get("n_ctx"))
    return _positive_int(body.get("n_ctx")) if isinstance(body, dict) else None


def _lm_studio(body: Any, model: str) -> int | None:
    if not isinstance(body, dict):
        return None
    return _positive_int(body.get("loaded_context_length")) or _positive_int(
        body.get("max_context_length")
    )


def _ollama(body: Any, model: str) -> int | None:
    if not isinstance(body, dict):
        return None
    for line in str(body.get("parameters") or "").splitlines():
        name, _, value = line.strip().partition(" ")
        if name == "num_ctx" and value.strip().isdigit():
            return _positive_int(int(value.strip()))
    info = body.get("model_info")
    if isinstance(info, dict):
        for key, value in info.items():
            if key.endswith(".context_length") and (tokens := _positive_int(value)):
                return tokens
    return None


async def _native(client: openai.AsyncOpenAI, model: str) -> Window | None:
    """Ask the server families' own endpoints, in order."""
    root = _root(str(client.base_url))
    headers = {"Authorization": f"Bearer {client.api_key}"}
    asks = (
        ("GET", "/props", None, _llama_cpp, "llama.cpp /props"),
        ("GET", f"/api/v0/models/{model}", None, _lm_studio, "LM Studio /api/v0/models"),
        ("POST", "/api/show", {"model": model}, _ollama, "Ollama /api/show"),
    )
    async with httpx.AsyncClient(timeout=TIMEOUT, headers=headers) as http:
        for method, path, body, read, source in asks:
            try:
                response = await http.request(method, root + path, json=body)
            except httpx.TransportError as exc:
                raise Unreachable(str(exc)) from exc
            if response.status_code != 200:
                continue
            try:
                tokens = read(response.json(), model)
            except ValueError:
                continue
            if tokens is not None:
                return Window(tokens, source)
    return None


async def discover_window(client: openai.AsyncOpenAI, model: str) -> Window | None:
    """The context window the server states for `model`, or None; raises Unreachable."""
    ask = client.with_options(timeout=openai.Timeout(15.0, connect=5.0))
    try:
        if (tokens := window_of_card(await ask.models.retrieve(model))) is not None:
            return Window(tokens, "/v1/models")
    except openai.APIConnectionError as exc:
        raise Unreachable(connection_failure(exc) or "the request timed out") from exc
    except (openai.APIError, ValueError, TypeError):
        pass
    try:
        async for card in ask.models.list():
            if getattr(card, "id", None) == model:
                if (tokens := window_of_card(card)) is not None:
                    return Window(tokens, "/v1/models")
                break
    except openai.APIConnectionError as exc:
        raise Unreachable(connection_failure(exc) or "the request timed out") from exc
    except (openai.APIError, ValueError, TypeError):
        pass
    return await _native(client, model)


async def list_models(client: openai.AsyncOpenAI) -> list[dict[str, Any]]:
    """The server's own `GET {base}/models`, as `{id, context_window?}` cards; raises
    Unreachable when it cannot be reached and `openai.APIError` when it refuses."""
    ask = client.with_options(timeout=openai.Timeout(15.0, connect=5.0))
    cards: list[dict[str, Any]] = []
    try:
        async for card in ask.models.list():
            model_id = getattr(card, "id", None)
            if not isinstance(model_id, str) or not model_id:
                continue
            entry: dict[str, Any] = {"id": model_id}
            if (tokens := window_of_card(card)) is not None:
                entry["context_window"] = tokens
            cards.append(entry)
    except openai.APIConnectionError as exc:
        raise Unreachable(connection_failure(exc) or "the request timed out") from exc
    return cards


async def count_tokens(client: openai.AsyncOpenAI, model: str, text: str) -> int | None:
    """The server's own token count of `text`, where it has ``POST {root}/tokenize``
    (llama.cpp: ``{content}`` -> ``{tokens}``; vLLM: ``{model, prompt}`` -> ``{count}``);
    None when it has none or cannot be reached."""
    root = _root(str(client.base_url))
    headers = {"Authorization": f"Bearer {client.api_key}"}
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT, headers=headers) as http:
            response = await http.post(
                root + "/tokenize", json={"model": model, "content": text, "prompt": text}
            )
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    if (count := _positive_int(body.get("count"))) is not None:
        return count
    tokens = body.get("tokens")
    return len(tokens) if isinstance(tokens, list) and tokens else None


def untransformed(body: dict[str, Any]) -> dict[str, Any]:
    """`create()` arguments that send `body` (not streamed) as it is. The SDK walks the
    request params recursively against its type hints before sending, on the event loop:
    about 13 ms for a 90-message history, over a third of the server's loop under
    bench/load_test.py. Tether builds plain JSON messages itself, so they travel in
    `extra_body` (which replaces the keys) and the walked params stay tiny."""
    return {"model": body["model"], "messages": [], "extra_body": body}
