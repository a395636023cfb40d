"""The endpoint side of the OpenAI-compatible runtime (runtimes/openai.py): the SDK client and
its HTTP pool, the endpoint's model list, what it says about a model's context window and
tokenizer, the non-streaming summary request compression sends, and how its failures become
`ProviderError`s (`runtimes.openai_errors` holds the mapping). Kept apart from the turn's
loop, which only asks it things."""

from __future__ import annotations

import os
import time
from typing import Any, NoReturn
from urllib.parse import urlsplit

import openai

from tether.runtimes.base import ProviderError, Runtime, RuntimeUnavailable
from tether.runtimes.compression import (
    SAFETY_SCALE,
    clean_summary,
    content_text,
    estimate_text_tokens,
    measured_scale,
    summary_reply_tokens,
    summary_request,
)
from tether.runtimes.openai_errors import classify, error_in, hung_up_unanswered, stream_error
from tether.runtimes.openai_models import (
    Unreachable,
    Window,
    count_tokens,
    discover_window,
    list_models,
    untransformed,
)
from tether.settings import Settings

PLACEHOLDER_API_KEY = "not-needed"
# `GET /api/models` asks the endpoint at most this often (seconds): a page load asks each time.
MODELS_CACHE_SECONDS = 30.0
# Local models can think for minutes before the first token; a dead host should fail fast.
TIMEOUT = openai.Timeout(600.0, connect=10.0)
TOKENIZE_CHARS = 20_000  # the sample a server's /tokenize measures


def _check_base_url(url: str | None) -> None:
    """The SDK takes any string, so a URL without its scheme would fail only at each turn."""
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RuntimeUnavailable(
            f"--base-url {url!r} is not an http:// or https:// URL (e.g. http://localhost:11434/v1)."
        )


class OpenAIEndpoint(Runtime):
    """One OpenAI-compatible endpoint, as the runtime's turns use it."""

    def __init__(self, settings: Settings):
        if not settings.model:
            raise RuntimeUnavailable("--model is required with --runtime openai.")
        _check_base_url(settings.base_url)
        self.settings = settings
        self.model: str = settings.model
        self._windows: dict[str, Window | None] = {}
        self._scales: dict[str, float | None] = {}  # tokenizer density per model, once known
        self._api_key_set = bool(os.environ.get(settings.api_key_env))
        self._max_tokens_key = "max_tokens"  # or max_completion_tokens, once a server asks
        self._models: tuple[float, list[dict[str, Any]]] | None = None  # (when, cards)
        # The SDK's own HTTP client (its trust store, redirects, pool limits), which the
        # streamed turn also uses without the SDK's request building: one pool. Its aiohttp
        # transport (the SDK's `aiohttp` extra) reads a streamed body for less than half the
        # CPU per chunk of its default one, which parses HTTP in Python (bench/README.md).
        self._http = openai.DefaultAioHttpClient()
        self._client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=os.environ.get(settings.api_key_env) or PLACEHOLDER_API_KEY,
            max_retries=0,
            timeout=TIMEOUT,
            http_client=self._http,
        )
        self._completions_url = f"{self._where()}/chat/completions"
        self._headers = {  # the SDK's (organization and project when set) and the key
            **{k: v for k, v in self._client.default_headers.items() if isinstance(v, str)},
            **self._client.auth_headers,
        }

    async def list_models(self) -> list[dict[str, Any]]:
        """The endpoint's own `GET /v1/models`, cached for MODELS_CACHE_SECONDS."""
        if self._models is not None and time.monotonic() - self._models[0] < MODELS_CACHE_SECONDS:
            return self._models[1]
        try:
            cards = await list_models(self._client)
        except Unreachable as exc:
            raise ProviderError(
                "network", f"The model provider at {self._where()} cannot be reached: {exc}"
            ) from exc
        except openai.APIError as exc:
            self._raise_classified(exc, self.model, streaming=False)
        self._models = (time.monotonic(), cards)
        return cards

    async def aclose(self) -> None:
        await self._client.close()  # and its HTTP client

    async def _context_window(self, model: str) -> int | None:
        """`--context-window`, else what the provider says about `model` (looked up once;
        a provider that cannot be reached is asked again next time)."""
        if self.settings.context_window:
            return int(self.settings.context_window)
        if model not in self._windows:
            try:
                self._windows[model] = await discover_window(self._client, model)
            except Unreachable:
                return None
        window = self._windows[model]
        return window.tokens if window else None

    @property
    def context_window(self) -> int | None:
        """The window of the default model, once known (looked up at its first turn)."""
        if self.settings.context_window:
            return int(self.settings.context_window)
        window = self._windows.get(self.model)
        return window.tokens if window else None

    @property
    def context_window_source(self) -> str | None:
        """Where the default model's window came from (/api/health)."""
        if self.settings.context_window:
            return "--context-window"
        window = self._windows.get(self.model)
        return window.source if window else None

    async def _scale(self, model: str, messages: list[dict[str, Any]]) -> float:
        """How much denser than chars/4 this model's tokenizer counts: measured from an
        earlier request's usage, else once by the server's /tokenize, else SAFETY_SCALE."""
        if model not in self._scales:
            sample = "\n".join(content_text(m.get("content")) for m in messages)[-TOKENIZE_CHARS:]
            counted = await count_tokens(self._client, model, sample) if sample.strip() else None
            self._scales[model] = (
                measured_scale(counted, estimate_text_tokens(sample)) if counted else None
            )
        return self._scales[model] or SAFETY_SCALE

    async def summarize(self, messages: list[dict[str, Any]], model: str | None) -> str:
        """A handoff summary of `messages` (OpenAI-shaped; attachment parts are named, not
        read) from one non-streaming request. Raises ProviderError."""
        model = model or self.model
        window = await self._context_window(model)
        return await self._summary(model, summary_request(messages, window=window), window)

    async def _summary(
        self, model: str, messages: list[dict[str, Any]], window: int | None = None
    ) -> str:
        """One non-streaming summary request without tools."""
        body: dict[str, Any] = {"model": model, "messages": messages}
        if window:
            body[self._max_tokens_key] = summary_reply_tokens(window)
        resent = False
        while True:
            try:
                raw = await self._client.chat.completions.with_raw_response.create(
                    **untransformed(body)
                )
                response = raw.parse()
                break
            except Exception as exc:
                if hung_up_unanswered(exc) and not resent:
                    resent = True  # once, as a streamed turn's request (runtimes/openai.py)
                    continue
                if not self._renames_max_tokens(exc, body):
                    self._raise_classified(exc, model, streaming=False)
        error = error_in(response.to_dict())
        if error is not None:  # a 200 whose body is an error (OpenRouter, gateways, vLLM)
            self._raise_classified(stream_error(error, raw.http_request), model, streaming=False)
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        summary = clean_summary(getattr(message, "content", None))
        if not summary:
            raise ProviderError(
                "bad_response",
                f"The model provider at {self._where()} "
                "returned an empty summary when asked to compress the "
                "conversation.",
            )
        return summary

    def _renames_max_tokens(self, exc: Exception, body: dict[str, Any]) -> bool:
        """OpenAI's reasoning models refuse `max_tokens` and ask for `max_completion_tokens`:
        switch once (for every later request too) and tell the caller to send again."""
        if (
            self._max_tokens_key == "max_tokens"
            and "max_tokens" in body
            and isinstance(exc, openai.BadRequestError)
            and "max_completion_tokens" in str(exc)
        ):
            self._max_tokens_key = "max_completion_tokens"
            body["max_completion_tokens"] = body.pop("max_tokens")
            return True
        return False

    def _where(self) -> str:
        return str(self._client.base_url).rstrip("/")

    def _raise_classified(
        self, exc: Exception, model: str, *, streaming: bool, tools: bool = False
    ) -> NoReturn:
        """Re-raise `exc` as a ProviderError, or unchanged if it is not a provider failure
        (a bug in Tether must not pass for a provider problem)."""
        error = classify(
            exc,
            model=model,
            where=self._where(),
            streaming=streaming,
            key_env=self.settings.api_key_env,
            key_set=self._api_key_set,
            tools=tools,
        )
        if error is exc:
            raise exc
        raise error from exc
