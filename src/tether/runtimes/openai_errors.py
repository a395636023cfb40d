"""Provider failures of an OpenAI-compatible endpoint as typed `ProviderError`s, with a
message a person can act on (the provider's own words included). First match wins:

* 401 / 403, and 402 (payment required: no credits left) -> ``auth``; 429 -> ``rate_limit``
* 413, or any error whose code or message says the context is too long -> ``context_overflow``
* 404, or a 400 saying the server serves another model (``transformers serve``'s "Server is
  pinned to ...") -> ``model_not_found`` (a wrong ``--base-url`` also lands on 404; the
  message says so)
* another 4xx about tools, to a request that offered tools -> ``internal``, saying that this
  server refuses tools with a streamed request and how to enable them
* an error reported inside the stream with code 429 (OpenRouter) -> ``rate_limit``
* 5xx, other errors reported inside the stream, unparseable JSON -> ``bad_response``
* other 4xx -> ``internal``: the provider refused the request Tether built
* connection refused / dropped, timeouts, transport errors -> ``network``
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import re
from typing import Any

import aiohttp
import httpx
import openai

from tether.runtimes.base import ProviderError

_CONTEXT_RE = re.compile(
    r"context[_ ]?length|context[_ ]?window|context[_ ]?size|maximum context|too many tokens"
    r"|prompt is too long|input is too long|exceed_context|reduce the length"
    # xAI, vLLM V1, Gemini, then text-generation-inference (HF endpoints, Together)
    r"|maximum prompt length|maximum model length|maximum number of tokens allowed"
    r"|`inputs` tokens \+ `max_new_tokens`|`inputs` must have less than",
    re.IGNORECASE,
)


_OTHER_MODEL_RE = re.compile(
    r"server is pinned to|model (?:'[^']*'|\"[^\"]*\"|\S+) (?:was )?not found|unknown model",
    re.IGNORECASE,
)
_RATE_LIMIT_CODES = frozenset({"429", "rate_limit_exceeded"})  # an in-stream error's `code`
_TOOLS_RE = re.compile(r"\btools?\b|tool_choice|function[_ ]call", re.IGNORECASE)
TOOLS_HINT = (
    "Tether offers its workspace tools with every streamed request (tool_choice auto), and "
    "this server refuses them. Start it with tool calling on (vLLM: --enable-auto-tool-choice "
    "and a --tool-call-parser; llama.cpp: --jinja; llama-cpp-python: a chat format with "
    "function calling), or run Tether without --workspace."
)


_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.TransportError,)
_TIMEOUTS: tuple[type[Exception], ...] = (httpx.TimeoutException,)
with contextlib.suppress(ImportError):  # the SDK's own HTTP stack; the SDK normally wraps these
    import httpx2

    _TRANSPORT_ERRORS += (httpx2.TransportError,)
    _TIMEOUTS += (httpx2.TimeoutException,)


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


_PAGE_RE = re.compile(r"<(?:!doctype|html|head|body)\b", re.IGNORECASE)
_TITLE_RE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_HIDDEN_RE = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG_RE = re.compile(r"<[^>]*>")


def _page_words(text: str) -> str:
    """What an HTML page (a proxy's, a web server's, Cloudflare's) says, in words: its title,
    else its visible text; its markup is no message a person can read."""
    title = _TITLE_RE.search(text)
    words = title.group(1) if title else _TAG_RE.sub(" ", _HIDDEN_RE.sub(" ", text))
    words = " ".join(html.unescape(words).split())
    return f"an HTML page: {words[:300]}" if words else "an HTML page"


def _detail(exc: openai.APIError) -> str:
    """The provider's own message, without the SDK's "Error code: 400 - {...}" wrapping."""
    body = exc.body
    if isinstance(body, list) and body:  # Gemini's OpenAI endpoint: [{"error": {...}}]
        body = body[0]
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = None
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("detail")
        elif isinstance(inner, str):
            message = inner
        message = message or body.get("message") or body.get("detail")
        if message:
            return str(message)
    if isinstance(body, str) and body.strip():
        return _page_words(body) if _PAGE_RE.search(body) else body.strip()[:500]
    return exc.message


def connection_failure(exc: openai.APIConnectionError) -> str | None:
    """What failed under the SDK's connection error, in words; None when it timed out. The
    SDK's aiohttp transport raises httpx's ConnectTimeout for every aiohttp connection error,
    a refused connection included (the SDK then says "timed out"), with aiohttp's own error
    as its cause: that one is the failure, unless it is itself a timeout."""
    cause = exc.__cause__ or exc.__context__
    inner = cause.__cause__ if cause is not None else None
    if isinstance(inner, aiohttp.ClientError):
        if isinstance(inner, TimeoutError):
            return None
        cause = inner
    elif isinstance(exc, openai.APITimeoutError):
        return None
    return f"{type(cause).__name__}: {cause}" if cause and str(cause) else exc.message


def classify(
    exc: Exception,
    *,
    model: str,
    where: str,
    streaming: bool,
    key_env: str,
    key_set: bool,
    tools: bool = False,
) -> Exception:
    """The ProviderError for `exc`, or `exc` itself if it is not a provider failure."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, openai.APIConnectionError):
        reason = connection_failure(exc)
        if reason is None:
            return ProviderError(
                "network",
                f"The model provider at {where} did not answer in time (the request timed out).",
            )
        what = (
            "The connection to the model provider at {} was lost mid-answer"
            if streaming
            else "Could not reach the model provider at {}"
        )
        return ProviderError("network", f"{what.format(where)} ({reason}).")
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, model, where, key_env, key_set, tools)
    if isinstance(exc, openai.APIError):  # an error event inside the stream, or bad data
        detail = _detail(exc)
        if _CONTEXT_RE.search(f"{exc.code or ''} {detail}"):
            return ProviderError(
                "context_overflow",
                f"The conversation no longer fits the model's context window: {_sentence(detail)}",
            )
        if str(exc.code) in _RATE_LIMIT_CODES or exc.type == "rate_limit_error":
            return ProviderError(  # OpenRouter: an upstream's limit, mid-answer
                "rate_limit",
                f"The model provider is rate limiting requests: {_sentence(detail)} "
                "Wait a moment and try again.",
            )
        return ProviderError(
            "bad_response",
            f"The model provider reported an error while answering: {_sentence(detail)}",
        )
    if isinstance(exc, json.JSONDecodeError):
        return ProviderError(
            "bad_response",
            f"The model provider at {where} sent data that is not valid JSON ({exc}).",
        )
    if isinstance(exc, (*_TRANSPORT_ERRORS, OSError)):
        failure = exc.__cause__ if isinstance(exc.__cause__, aiohttp.ClientError) else exc
        return ProviderError(
            "network",
            f"The connection to the model provider at {where} "
            f"failed ({type(failure).__name__}: {failure}).",
        )
    if isinstance(exc, httpx.HTTPError):
        return ProviderError(
            "bad_response",
            f"The model provider at {where} sent a response Tether could not read ({exc}).",
        )
    return exc


def _status_error(
    exc: openai.APIStatusError, model: str, where: str, key_env: str, key_set: bool, tools: bool
) -> ProviderError:
    status = exc.status_code
    detail = _sentence(_detail(exc))
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        hint = f" Check the key in {key_env}." if key_set else f" Set {key_env} to your API key."
        verb = "rejected the credentials" if status == 401 else "refused access"
        return ProviderError(
            "auth", f"The model provider at {where} {verb} (HTTP {status}): {detail}{hint}"
        )
    if status == 402:  # OpenRouter and others: the account has no credits left
        return ProviderError(
            "auth",
            f"The model provider at {where} refused the account: payment required (HTTP 402): "
            f"{detail} Check the account's credits or billing.",
        )
    if isinstance(exc, openai.RateLimitError):
        return ProviderError(
            "rate_limit",
            f"The model provider is rate limiting requests (HTTP 429): {detail} "
            f"{_wait_hint(exc.response.headers.get('retry-after'))}",
        )
    if status == 413 or _CONTEXT_RE.search(f"{exc.code or ''} {detail}"):
        return ProviderError(
            "context_overflow",
            f"The conversation no longer fits the model's context window (HTTP {status}): {detail}",
        )
    if isinstance(exc, openai.NotFoundError) or (status < 500 and _OTHER_MODEL_RE.search(detail)):
        return ProviderError(
            "model_not_found",
            f"The model provider at {where} does not "
            f"know the model {model!r} (HTTP {status}): {detail} Check --model "
            "and --base-url.",
        )
    if status >= 500:
        return ProviderError("bad_response", f"The model provider failed (HTTP {status}): {detail}")
    if tools and _TOOLS_RE.search(detail):
        return ProviderError(
            "internal",
            f"The model provider at {where} refused the request with tools (HTTP {status}): "
            f"{detail} {TOOLS_HINT}",
        )
    return ProviderError(
        "internal", f"The model provider rejected the request (HTTP {status}): {detail}"
    )


def _wait_hint(retry_after: str | None) -> str:
    """What to tell a person about a 429's `Retry-After` (seconds; an HTTP date is rarer
    from model providers and is left to "a moment")."""
    try:
        seconds = math.ceil(float(retry_after or ""))
    except (ValueError, OverflowError):  # not a number, or "inf"
        seconds = 0
    if seconds > 0:
        return f"The provider asks to wait {seconds} s before trying again."
    return "Wait a moment and try again."


_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def status_error(response: Any) -> openai.APIStatusError:
    """The error the SDK raises for a refused request (its classes, its message and body),
    for a response Tether read on the SDK's HTTP client itself (`Any` here: httpx, or
    httpx2 in recent SDKs): `classify` then reads both alike."""
    text = response.text.strip()
    body: object = text
    message = f"Error code: {response.status_code}"
    with contextlib.suppress(ValueError):
        body = json.loads(text)
    data = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(data, dict) and isinstance(data.get("message"), str) and data["message"]:
        message += f" - {data['message']}"
    kind = _STATUS_ERRORS.get(response.status_code)
    if kind is None:
        kind = openai.InternalServerError if response.status_code >= 500 else openai.APIStatusError
    return kind(message, response=response, body=data)


# A connection that failed under a request it carried: closed (FIN) or reset (RST, as a server
# closing with the request's bytes unread makes it), or unwritable. The two aiohttp itself
# resends an idempotent request on (RFC 9112 section 9.3.1.1); a POST it never resends.
_HUNG_UP = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def hung_up_unanswered(exc: BaseException) -> bool:
    """The server hung up before a byte of its answer (aiohttp's ServerDisconnectedError, or
    a ClientOSError such as ECONNRESET, under the SDK's errors). Mostly a kept-alive
    connection it closed as idle while the request was on its way (uvicorn, which vLLM and
    llama-cpp-python serve on, does so after 5 s; a reset more often than a clean close):
    nothing was answered, so the request may go once more, on a new connection, as a
    browser's would. A connection that could not be opened (ClientConnectorError, itself a
    ClientOSError: refused, DNS, TLS) is no hang-up: opening another would fail alike.
    A streamed turn asks this only before its answer's headers are in, so nothing shown is
    ever sent twice; the SDK reads a summary's whole answer before returning, so one cut
    midway is sent again too, which costs only the second request (a summary is never
    shown as it comes)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, aiohttp.ClientConnectorError):
            return False
        if isinstance(cause, _HUNG_UP):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def error_in(body: object) -> object | None:
    """The error a JSON body is, when it is one: `{"error": ...}` (OpenAI, OpenRouter,
    gateways) or `{"object": "error", ...}` (older vLLM); None for anything else."""
    if not isinstance(body, dict):
        return None
    if body.get("error") is not None:
        return body["error"]
    return body if body.get("object") == "error" else None


def stream_error(error: object, request: Any) -> openai.APIError:
    """An error the provider sent in a 200's body (inside the stream, or as the whole body),
    as the SDK itself would raise it."""
    message = (error.get("message") if isinstance(error, dict) else None) or str(error)
    return openai.APIError(message, request, body=error)


async def send_streamed(http: Any, request: Any) -> Any:
    """Send a streamed request on the SDK's HTTP client; anything but a 2xx (redirects are
    followed first) or a transport failure is raised as the SDK would raise it, so one
    classification serves both paths."""
    try:
        response = await http.send(request, stream=True)
    except _TIMEOUTS as exc:
        raise openai.APITimeoutError(request=request) from exc
    except _TRANSPORT_ERRORS as exc:
        raise openai.APIConnectionError(request=request) from exc
    if not response.is_success:
        try:
            await response.aread()
        finally:
            await response.aclose()
        raise status_error(response)
    return response
