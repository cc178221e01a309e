"""A model for any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, llama.cpp, Ollama...).

```python
from zett_agent.models.openai import OpenAIChatModel

model = OpenAIChatModel("gpt-4o-mini")                                  # key from $OPENAI_API_KEY
local = OpenAIChatModel("qwen2.5", base_url="http://127.0.0.1:8000/v1")  # no key needed
```

Retries are the runtime's job: the agent retries a failed model call per ``model.retry`` when the
error is a ``TransientModelError`` (rate limit, server error, dropped connection, timeout). This
adapter makes exactly one HTTP request per ``stream()`` call and never sleeps or retries itself.
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

from zett_agent._model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    RetryOptions,
    TransientModelError,
)
from zett_agent._tracing._base import (
    FINISH_REASONS,
    PROVIDER,
    PROVIDER_OPENAI,
    RESPONSE_ID,
    RESPONSE_MODEL,
    SERVER_ADDRESS,
    SERVER_PORT,
)
from zett_agent._tracing._trace_models import note_model_call
from zett_agent.models import _http
from zett_agent.models._openai_wire import (
    ResponseAccumulator,
    SSEDecoder,
    build_body,
    decode_event,
    encode_body,
    error_detail,
    parse_json,
    shorten,
)

__all__ = ["OpenAIChatModel"]  # re-exported by zett_agent.models.openai

# Statuses worth another attempt, as the official OpenAI clients treat them.
_TRANSIENT_STATUSES = frozenset({408, 429})

#: Retry-After as delay-seconds (RFC 9110 10.2.3), fractions tolerated
_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")

_USER_AGENT = "zett-agent (OpenAI-compatible chat model)"

#: The host of the OpenAI API itself, the one endpoint that always needs a key.
_OPENAI_API_HOST = "api.openai.com"

#: What a response may make the adapter hold. One budget for a whole answer, streamed or not:
#: every byte of its body as received counts (comments and keep-alives, blank lines, chunk
#: framing), so the text and the tool calls it makes the adapter hold are at most that too, and
#: a stream that pings forever ends. One JSON document at most ``_MAX_JSON_BYTES``: one SSE
#: line (one streamed chunk), the data of one server-sent event, or a whole answer the server did
#: not stream (parsing one costs a few ms per MiB, in one go). An error body (only its first few
#: hundred characters are quoted) at most ``_MAX_ERROR_BYTES``.
_MAX_RESPONSE_BYTES = 64 * 2**20
_MAX_JSON_BYTES = 8 * 2**20
_MAX_LINE_BYTES = _MAX_JSON_BYTES
_MAX_ERROR_BYTES = 2**20
#: lines of one streamed response, at most: a million events, far more than the longest answer
#: (with its reasoning) streams, and a bound on the CPU a flood of blank lines can cost
_MAX_LINES = 2**21


class OpenAIChatModel:
    """A ``Model`` that streams from ``POST {base_url}/chat/completions``.

    Args:
        model: the model name the endpoint knows (``"gpt-4o-mini"``, ``"qwen2.5:7b"``...).
        base_url: the API root, up to and including ``/v1``.
        api_key: the key to send; when ``None`` it is read from ``$api_key_env`` at every request
            (so a child process uses its own environment). Aimed at the OpenAI API
            (``api.openai.com``), a model without a key fails before any request: at construction
            when neither ``api_key`` nor ``$api_key_env`` is set, and in ``stream()`` if the
            variable is gone by then (a child started with ``ProcessLimits(env=...)`` that
            lacks it). At any other ``base_url`` no ``Authorization`` header is sent when
            neither is set: local servers need none, and a server that does answers 401.
        api_key_env: the environment variable holding the key.
        retry: how the runtime retries this model's transient errors (see the module docstring).
        timeout: seconds allowed to connect, to send the request, to receive the response's
            status line and headers (all of them, interim responses included), and between two
            received pieces of its body (not for the whole body: a long answer may stream for
            minutes).
        temperature: sent when not ``None``.
        max_tokens: sent when not ``None``.
        extra_body: extra JSON fields merged into every request body last (provider-specific
            options such as ``{"top_p": 0.9}`` or ``{"max_completion_tokens": 512}``).

    The object holds configuration only, so it pickles with ``pickle`` and ``cloudpickle`` and can
    be shipped to child processes; every ``stream()`` call opens (and closes) its own connection in
    whatever event loop it runs in.

    Raises ``ValueError`` for an unusable argument (empty model name, a base URL that is not
    http(s), a non-positive timeout, an ``extra_body`` that is not JSON-serialisable), or when
    aimed at the OpenAI API with no key (the one-line message says to set the variable or pass
    ``api_key=``).

    HTTP: each ``stream()`` opens one HTTP/1.1 connection of its own (a small client on asyncio
    streams, ``zett_agent.models._http``; no connection pool, no HTTP/2) and closes it at the end.
    ``https://`` certificates are verified against certifi's CA bundle, or ``$SSL_CERT_FILE`` /
    ``$SSL_CERT_DIR`` when set (read once per process, when its TLS context is built). Proxies
    come from the environment at each request: ``$HTTPS_PROXY``, ``$HTTP_PROXY``,
    ``$ALL_PROXY`` (``http://`` proxies only; https goes through a ``CONNECT`` tunnel) and
    ``$NO_PROXY``, in upper or lower case. Redirects are not followed.

    Bounds, so a hostile or broken server can make the adapter neither hold much nor spin: a
    response may send at most 64 KiB of headers (interim responses included, at most 16 of
    them, all within ``timeout``), 1 MiB of an error body (more is not read: the status still
    decides), and 64 MiB of body in all, streamed or not (every byte received counts, keep-alive
    comments too, so a stream that never ends does end), in at most 2 Mi lines and 1 Mi chunks;
    one JSON document (an SSE line, an event's data, a non-streamed answer) at most 8 MiB and,
    if larger than 64 KiB, with at most 131072 commas and colons outside its strings;
    one answer at most 1024 tool calls. Each is a ``ModelError`` that names it.

    Child processes: ``child_preload`` names the module that loads the CA bundle and builds the
    process's TLS context; a subagent extension's process pool imports it once in its launcher,
    so a child on this model starts warm and shares that memory.
    """

    retry: RetryOptions
    #: modules a child process on this model would import at its first request (see above)
    child_preload: ClassVar[tuple[str, ...]] = ("zett_agent.models._openai_preload",)
    #: a brokered child gets a keyless stand-in and the parent makes its calls: nothing in a
    #: request chooses the endpoint, the model name or the key
    #: (``zett_agent.runners._broker._parent``)
    brokerable: ClassVar[bool] = True

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        retry: RetryOptions = RetryOptions(),  # noqa: B008 (frozen, so sharing the default is safe)
        timeout: float = 60.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError(f"model must be a non-empty model name, got {model!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https://, got {base_url!r} "
                "(for example 'http://127.0.0.1:8000/v1')"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        body = dict(extra_body or {})
        try:
            json.dumps(body)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra_body must be JSON-serialisable: {exc}") from exc
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.retry = retry
        self.timeout = float(timeout)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body: dict[str, Any] = body
        self._api_key = api_key
        if self._needs_key() and self._resolve_key() is None:
            raise ValueError(self._missing_key_message())
        # Built on first use (loading the CA bundle costs milliseconds), never pickled.
        self._ssl_context: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/chat/completions``."""
        return f"{self.base_url}/chat/completions"

    @property
    def span_attributes(self) -> dict[str, str | int]:
        """What the runtime's spans of this model say about it (``docs/tracing.md``).

        ``gen_ai.provider.name`` ``openai`` (the API this adapter speaks, whatever server
        answers it), ``server.address`` and ``server.port`` of ``base_url``.
        """
        url = urlsplit(self.base_url)
        attributes: dict[str, str | int] = {PROVIDER: PROVIDER_OPENAI}
        if url.hostname:
            attributes[SERVER_ADDRESS] = url.hostname
        try:
            port = url.port
        except ValueError:  # not a port number: the request names the problem
            port = None
        attributes[SERVER_PORT] = port or (443 if url.scheme == "https" else 80)
        return attributes

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else f"${self.api_key_env}"
        return f"OpenAIChatModel({self.model!r}, base_url={self.base_url!r}, api_key={key})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ssl_context"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    async def aclose(self) -> None:
        """Release what the model holds. Idempotent.

        Every ``stream()`` owns its connection and closes it when it ends, so nothing outlives a
        stream today; this exists so callers can treat the model as a closeable resource.
        """
        self._ssl_context = None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one completion: text deltas as they arrive, then one completed event.

        Raises:
            TransientModelError: HTTP 408, 429 or 5xx (``status`` set; a ``Retry-After`` hint is
                quoted in the message), a connection that failed, dropped or ended mid-response
                (a certificate that does not verify, a proxy that refused the tunnel), a timeout
                (``status`` ``None``), or a stream that ended before the response was complete.
                The runtime retries these per ``self.retry``.
            ModelError: (``retryable=False``) no API key while aimed at the OpenAI API, or a
                request that cannot be sent as configured (an unsupported proxy URL, a key with
                a line break; both raised before anything is sent), any other HTTP error, with
                the server's own message (401: check the API key; 404: check the model name and
                base URL), a response that could not be decoded (malformed HTTP framing, more
                than the bounds above, a compressed body), a malformed stream, or a tool call
                whose arguments are not a JSON object (the message names the tool and quotes the
                text); a request that cannot be encoded (a message kind Chat Completions has no
                role for, tool parameters JSON cannot hold). Any other failure while talking to
                the endpoint is a ``ModelError`` too (the message names the exception): nothing
                but ``ModelError`` and ``CancelledError`` leaves this call.

        Text: a lone surrogate anywhere in ``request`` is sent as U+FFFD, and so is a lone
        surrogate escape the server sends (the text and tool calls yielded are valid Unicode).

        Cancellation: cancelling the consuming task, or closing the iterator early (``aclose()``,
        ``contextlib.aclosing``, ``break`` inside ``async with aclosing(...)``), closes the HTTP
        response and the connection before the cancellation propagates; the server sees the
        client go away. An iterator that is dropped without being closed is closed by the event
        loop's async-generator finaliser, later.
        """
        try:
            content = encode_body(
                build_body(
                    self.model,
                    request,
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                    extra_body=self.extra_body,
                )
            )
        except (TypeError, ValueError, RecursionError) as exc:
            raise ModelError(
                f"cannot encode a request for {self.url}: {type(exc).__name__}: {exc}"
            ) from exc
        headers = {
            "Accept": "text/event-stream",
            "Content-Type": "application/json",
            "User-Agent": _USER_AGENT,
        }
        key = self._resolve_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        elif self._needs_key():
            raise ModelError(self._missing_key_message(), retryable=False)
        response: _http.Response | None = None
        try:
            response = await _http.post(
                self.url, content, headers, io_timeout=self.timeout, tls=self._ssl
            )
            if response.status != 200:
                raise self._status_error(response, await _error_body(response), sent_key=bool(key))
            accumulator = ResponseAccumulator()
            if _is_json(response):
                # The server ignored stream=true and answered with one complete body.
                text = accumulator.add_chunk(
                    _parse_json_body(await response.aread(_MAX_JSON_BYTES))
                )
                if text:
                    yield ModelEvent.text_delta(text)
            else:
                async for text in _stream_text(response, accumulator):
                    yield ModelEvent.text_delta(text)
            _note_response(accumulator)
            final: ModelResponse = accumulator.response()
        except _http.HTTPTimeout as exc:
            raise TransientModelError(
                f"the model endpoint {self.url} did not answer within {self.timeout:g} s "
                f"({type(exc).__name__}: {exc}); raise timeout= if the server is just slow"
            ) from exc
        except _http.TransportError as exc:
            raise TransientModelError(
                f"could not talk to the model endpoint {self.url}: {exc}"
            ) from exc
        except _http.DecodingError as exc:
            raise ModelError(
                f"the model endpoint {self.url} sent a response that could not be decoded: {exc}"
            ) from exc
        except _http.RequestError as exc:
            raise ModelError(f"cannot send a request to {self.url}: {exc}") from exc
        except ModelError:
            raise
        except Exception as exc:
            # A defect of this adapter that some response shape reached: still the model's
            # error for the runtime, never a raise it does not expect.
            raise ModelError(
                f"talking to the model endpoint {self.url} failed unexpectedly "
                f"({type(exc).__name__}: {shorten(str(exc))})"
            ) from exc
        finally:
            if response is not None:
                await response.aclose()
        yield ModelEvent.completed(final)

    def _resolve_key(self) -> str | None:
        if self._api_key is not None:
            return self._api_key
        return os.environ.get(self.api_key_env) or None

    def _needs_key(self) -> bool:
        """Whether requests go to the OpenAI API itself (other endpoints may need no key)."""
        return (urlsplit(self.base_url).hostname or "").lower() == _OPENAI_API_HOST

    def _missing_key_message(self) -> str:
        return (
            f"OpenAIChatModel({self.model!r}) has no API key for {self.base_url}: set "
            f"{self.api_key_env} in the environment or pass api_key=... (a local "
            "OpenAI-compatible server needs none: pass its base_url=)"
        )

    def _ssl(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = _http.default_ssl_context()
        return self._ssl_context

    def _status_error(self, response: _http.Response, body: bytes, *, sent_key: bool) -> ModelError:
        status = response.status
        detail = error_detail(body)
        where = f"the model endpoint {self.url} (model {self.model!r})"
        if status in _TRANSIENT_STATUSES or status >= 500:
            what = "rate-limited the request" if status == 429 else "failed"
            hint = _retry_after_hint(response.headers.get("retry-after"))
            return TransientModelError(
                f"{where} {what} (HTTP {status}): {detail}{hint}", status=status
            )
        if status == 401:
            fix = (
                f"check the API key in ${self.api_key_env} (or pass api_key=)"
                if sent_key
                else f"no API key was sent: set ${self.api_key_env} (or pass api_key=)"
            )
            message = f"{where} rejected the API key (HTTP 401): {detail}. {fix}"
        elif status == 403:
            message = (
                f"{where} refused access (HTTP 403): {detail}. Check that the API key in "
                f"${self.api_key_env} may use model {self.model!r}"
            )
        elif status == 404:
            message = (
                f"{where} was not found (HTTP 404): {detail}. Check the model name "
                f"{self.model!r} and the base URL {self.base_url!r} (it should end in /v1 for "
                "most servers)"
            )
        elif 300 <= status < 400:
            location = response.headers.get("location", "?")
            message = (
                f"{where} redirected (HTTP {status}) to {location}; set base_url to the final "
                "address"
            )
        else:
            message = f"{where} rejected the request (HTTP {status}): {detail}"
        return ModelError(message, retryable=False, status=status)


def _note_response(accumulator: ResponseAccumulator) -> None:
    """Put what the response said of itself on the model call's span (when traced)."""
    notes: dict[str, str | list[str]] = {}
    if accumulator.response_id:
        notes[RESPONSE_ID] = accumulator.response_id
    if accumulator.response_model:
        notes[RESPONSE_MODEL] = accumulator.response_model
    if accumulator.finish_reason:
        notes[FINISH_REASONS] = [accumulator.finish_reason]
    if notes:
        note_model_call(notes)


def _event_texts(
    chunks: list[Any] | None, accumulator: ResponseAccumulator
) -> Iterator[str | None]:
    """The text each chunk of one SSE event adds to ``accumulator``, in order.

    Empty texts are skipped; ``None`` comes last when the event ends the stream (``[DONE]``,
    which ``decode_event`` answers as ``None``, or a ``None`` chunk).
    """
    for chunk in chunks or [None]:
        if chunk is None:
            yield None
            return
        text = accumulator.add_chunk(chunk)
        if text:
            yield text


async def _stream_text(
    response: _http.Response, accumulator: ResponseAccumulator
) -> AsyncIterator[str]:
    """The text deltas of an SSE response, feeding every chunk to ``accumulator``.

    Raises ``ModelError`` past ``_MAX_LINES`` lines: each line costs a little, whatever its
    length, so a flood of blank lines or keep-alive comments does not cost as much CPU as
    ``_MAX_RESPONSE_BYTES`` of them would.
    """
    decoder = SSEDecoder(max_chars=_MAX_JSON_BYTES)
    batches = response.aiter_lines(_MAX_LINE_BYTES, _MAX_RESPONSE_BYTES)
    seen = 0
    try:
        async for lines in batches:
            seen += len(lines)
            if seen > _MAX_LINES:
                raise ModelError(
                    f"the model endpoint sent more than {_MAX_LINES} lines in one response "
                    "(a flood of blank lines or comments?)"
                )
            for line in lines:
                data = decoder.feed(line)
                if data is None:
                    continue
                for text in _event_texts(decode_event(data), accumulator):
                    if text is None:
                        return
                    yield text
    finally:
        await batches.aclose()  # now, not later through the loop's async-generator finaliser
    data = decoder.flush()
    if data is not None:
        for text in _event_texts(decode_event(data), accumulator):
            if text is None:
                return
            yield text
    if accumulator.finish_reason is None:
        # Neither [DONE] nor a finish_reason: the connection closed mid-answer.
        raise TransientModelError(
            "the model endpoint closed the stream before the response was complete "
            "(no [DONE] and no finish_reason)"
        )


async def _error_body(response: _http.Response) -> bytes:
    """The body of an error response, or a note saying why it is not there.

    The status says what went wrong and whether to retry, so a body that cannot be read (too
    large, malformed) does not replace it: the note takes the place of the server's message.
    """
    try:
        return await response.aread(_MAX_ERROR_BYTES)
    except _http.DecodingError as exc:
        return f"(the error body was not read: {exc})".encode()


def _is_json(response: _http.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "application/json"


def _parse_json_body(content: bytes) -> Any:
    # Decoded here, not by json.loads: it would let bytes that encode a surrogate through.
    text = content.decode("utf-8", errors="replace")
    try:
        return parse_json(text)
    except ValueError as exc:
        raise ModelError(
            f"the model endpoint answered with a JSON content type but the body is not JSON "
            f"({exc}): {shorten(text)!r}"
        ) from exc


def _retry_after_hint(value: str | None) -> str:
    """`` (the server asks to retry after N s)`` from a Retry-After header, or ``""``."""
    if not value:
        return ""
    value = value.strip()
    if _SECONDS.fullmatch(value):  # ASCII digits only: float() would take "١٢" or "1e9"
        seconds = float(value)
    else:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return ""
    if not math.isfinite(seconds):
        return ""
    return f" (the server asks to retry after {max(0.0, seconds):g} s)"
