"""An SDK's failures as the runtime's model errors: what failed, whether to retry, what to fix.

Both official SDKs raise the same kinds (``APIStatusError`` with ``status_code`` and the
response, ``APITimeoutError``, ``APIConnectionError``, ``APIError`` for an error reported
mid-stream); ``model_error`` turns any exception of a call into a ``ModelError``:

- ``TransientModelError`` (the runtime retries it per the model's ``RetryOptions``): HTTP 408,
  409, 429 (the server's ``Retry-After`` quoted), 5xx and 529 (overloaded), a timeout, the
  call's deadline, a connection that failed or dropped, an overloaded or rate-limited stream;
- ``ModelError`` (final): a rejected key (401, saying which variable to check), a refused model
  (403), a wrong model name or base URL (404), a conversation longer than the model's context
  (400, said so), any other status with the server's own message, a response that could not
  be decoded (malformed HTTP, SSE or JSON: the message names what was wrong and quotes it).

Every message names the endpoint and the model, is one paragraph of bounded length (a server's
text is cut to a few hundred characters) and never holds the key.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from zett_agent._model import ModelError, TransientModelError
from zett_agent._text import valid_text

__all__ = ["Call", "error_detail", "model_error", "shorten"]

_SNIPPET = 300
#: statuses worth another attempt, as the official clients treat them (and 529: overloaded)
_TRANSIENT = frozenset({408, 409, 429})
#: Retry-After as delay-seconds (RFC 9110 10.2.3), fractions tolerated; ASCII digits only
_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
#: what providers say when a conversation is longer than the model's context window
_CONTEXT = re.compile(
    r"context[_ ]length|context window|maximum context|prompt is too long|too many tokens",
    re.IGNORECASE,
)
#: what an HTTP library's protocol error says when the connection ended, rather than broke the
#: protocol (worth another attempt)
_DROPPED = ("disconnect", "closed", "incomplete", "peer", "reset", "eof")
#: error types of a stream that say to come back later
_TRANSIENT_TYPES = frozenset(
    {"server_error", "rate_limit_exceeded", "rate_limit_error", "overloaded_error", "api_error"}
)


def shorten(text: str, limit: int = _SNIPPET) -> str:
    """``text`` cut to ``limit`` characters, marking the cut, for error messages."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


@dataclass(frozen=True, slots=True)
class Call:
    """What an error message says of the call that failed."""

    #: the endpoint, as the user configured it (``{base_url}/chat/completions``)
    url: str
    model: str
    #: the variable the key is read from (named in the fixes)
    key_env: str
    #: whether a key was sent
    sent_key: bool
    #: the adapter's per-read timeout and whole-call deadline, in seconds
    timeout: float
    deadline: float

    @property
    def where(self) -> str:
        return f"the model endpoint {self.url} (model {self.model!r})"


def error_detail(body: bytes | str) -> str:
    """The human-readable message of an error body, in the shapes servers use.

    ``{"error": {"message": ..., "type": ..., "code": ...}}`` (OpenAI, Anthropic, vLLM,
    llama.cpp), ``{"error": "..."}``, ``{"message": ...}``, ``{"detail": ...}`` (FastAPI);
    anything else is returned as (shortened) text. Lone surrogates come out as U+FFFD.
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    text = valid_text(text.strip())
    data: Any = None
    if len(text) <= 2**20:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, str) and error:
            return shorten(valid_text(error))
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail")
            if isinstance(message, str) and message:
                code = error.get("code") or error.get("type")
                suffix = f" [{shorten(valid_text(code), 80)}]" if isinstance(code, str) else ""
                return shorten(valid_text(message)) + suffix
            if message:
                return shorten(valid_text(json.dumps(message)))
    return shorten(" ".join(text.split())) if text else "(empty response body)"


def retry_after_hint(value: str | None) -> str:
    """`` (the server asks to retry after N s)`` from a Retry-After header, or ``""``."""
    if not value:
        return ""
    value = value.strip()
    if _SECONDS.fullmatch(value):  # float() would take "١٢" or "1e9"
        seconds = float(value)
    else:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError, IndexError):
            return ""
    if not math.isfinite(seconds):
        return ""
    return f" (the server asks to retry after {max(0.0, seconds):g} s)"


def model_error(exc: BaseException, sdk: Any, call: Call) -> ModelError:
    """The ``ModelError`` a failed call of ``sdk`` (the SDK's module) ends with."""
    if isinstance(exc, ModelError):
        return exc
    if isinstance(exc, TimeoutError):  # the call's deadline (asyncio.timeout)
        return TransientModelError(
            f"{call.where} did not finish the call within its deadline of {call.deadline:g} s "
            "(a server that trickles, or an answer longer than the deadline allows: raise "
            "deadline= if the model is just slow)"
        )
    if isinstance(exc, sdk.APIStatusError):
        return _status_error(exc, call)
    if isinstance(exc, sdk.APITimeoutError):
        return TransientModelError(
            f"{call.where} did not answer within {call.timeout:g} s (no byte arrived for that "
            "long); raise timeout= if the server is just slow"
        )
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ModelError):  # the budget refused the response in a hook
            return cause
        name = type(cause).__name__ if cause is not None else ""
        text = str(cause).lower()
        dropped = any(word in text for word in _DROPPED)
        if ("Protocol" in name or "Decoding" in name) and not dropped:
            return ModelError(
                f"{call.where} sent a response that could not be decoded: {name}: "
                f"{shorten(str(cause) or 'malformed HTTP')}"
            )
        detail = f"{name}: {shorten(str(cause))}" if cause is not None else str(exc)
        return TransientModelError(f"could not talk to {call.where}: {detail}")
    if isinstance(exc, sdk.APIError):  # an error the stream reported (status 200)
        return _stream_error(exc, call)
    if isinstance(exc, json.JSONDecodeError):
        return ModelError(
            f"{call.where} sent a malformed stream event (not JSON: {exc.msg} at character "
            f"{exc.pos}): {shorten(valid_text(exc.doc))!r}"
        )
    if isinstance(exc, RecursionError):
        return ModelError(
            f"{call.where} sent a malformed stream event (not JSON: nested too deeply)"
        )
    if isinstance(exc, UnicodeDecodeError):
        return ModelError(f"{call.where} sent a stream that is not UTF-8 ({exc.reason})")
    # A defect of the adapter or the SDK that some response shape reached: still the model's
    # error for the runtime, never a raise it does not expect.
    return ModelError(
        f"talking to {call.where} failed unexpectedly ({type(exc).__name__}: "
        f"{shorten(valid_text(str(exc)))})"
    )


def _status_error(exc: Any, call: Call) -> ModelError:
    status: int = exc.status_code
    if status < 300:  # an error event of a stream that began well (Anthropic's ``error``)
        return _stream_error(exc, call)
    response = exc.response
    try:
        detail = error_detail(response.content)
    except Exception:  # the body was not read (it could not be)
        detail = shorten(valid_text(str(exc.message)))
    where = call.where
    if status in _TRANSIENT or status >= 500:
        what = {429: "rate-limited the request", 529: "is overloaded"}.get(status, "failed")
        hint = retry_after_hint(response.headers.get("retry-after"))
        return TransientModelError(f"{where} {what} (HTTP {status}): {detail}{hint}", status=status)
    if status == 401:
        fix = (
            f"check the API key in ${call.key_env} (or pass api_key=)"
            if call.sent_key
            else f"no API key was sent: set ${call.key_env} (or pass api_key=)"
        )
        message = f"{where} rejected the API key (HTTP 401): {detail}. {fix}"
    elif status == 403:
        message = (
            f"{where} refused access (HTTP 403): {detail}. Check that the API key in "
            f"${call.key_env} may use model {call.model!r}"
        )
    elif status == 404:
        message = (
            f"{where} was not found (HTTP 404): {detail}. Check the model name {call.model!r} "
            f"and the base URL of {call.url!r}"
        )
    elif 300 <= status < 400:
        location = shorten(response.headers.get("location", "?"), 200)
        message = (
            f"{where} redirected (HTTP {status}) to {location}; set base_url to the final address"
        )
    elif status in (400, 413) and _CONTEXT.search(detail):
        message = (
            f"{where} refused a conversation longer than the model's context window "
            f"(HTTP {status}): {detail}. Shorten the conversation or use a model with a larger "
            "context"
        )
    else:
        message = f"{where} rejected the request (HTTP {status}): {detail}"
    return ModelError(message, retryable=False, status=status)


def _stream_error(exc: Any, call: Call) -> ModelError:
    body = exc.body
    error = body.get("error", body) if isinstance(body, dict) else body
    kind = error.get("type") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(error, dict | list):
        detail = error_detail(json.dumps({"error": error}))
    else:
        detail = shorten(valid_text(str(exc.message)))
    status = code if type(code) is int and 100 <= code < 600 else None
    transient = kind in _TRANSIENT_TYPES or code in _TRANSIENT_TYPES
    if transient or (status is not None and (status in _TRANSIENT or status >= 500)):
        return TransientModelError(
            f"{call.where} reported an error mid-stream: {detail}", status=status
        )
    return ModelError(f"{call.where} reported an error mid-stream: {detail}", status=status)
