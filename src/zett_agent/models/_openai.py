"""A model for any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, llama.cpp, Ollama...).

```python
from zett_agent.models.openai import OpenAIChatModel

model = OpenAIChatModel("gpt-4o-mini")                                  # key from $OPENAI_API_KEY
local = OpenAIChatModel("qwen2.5", base_url="http://127.0.0.1:8000/v1")  # no key needed
```

Built on the official ``openai`` SDK (the ``openai`` extra: ``pip install 'zett-agent[openai]'``).
Retries are the runtime's job: the agent retries a failed model call per ``model.retry`` when the
error is a ``TransientModelError`` (rate limit, server error, dropped connection, timeout). The
SDK's own retries are off: this adapter makes exactly one HTTP request per ``stream()`` call and
never sleeps or retries itself.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

from zett_agent._model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    RetryOptions,
    TransientModelError,
)
from zett_agent._tracing._base import FINISH_REASONS, PROVIDER_OPENAI, RESPONSE_ID, RESPONSE_MODEL
from zett_agent._tracing._trace_models import note_model_call
from zett_agent.models._budget import paced
from zett_agent.models._extras import loaded, require
from zett_agent.models._openai_wire import ResponseAccumulator, build_request
from zett_agent.models._sdk_clients import LoopClients
from zett_agent.models._sdk_errors import Call, model_error, shorten
from zett_agent.models._sdk_http import (
    NO_KEY,
    PROXY_VARIABLES,
    KeyedClient,
    check_key,
    close_quietly,
    http_client,
    key_headers,
    post_stream,
    server_attributes,
    tls_context_ready,
)

__all__ = ["OpenAIChatModel"]  # re-exported by zett_agent.models.openai

#: The host of the OpenAI API itself, the one endpoint that always needs a key.
_OPENAI_API_HOST = "api.openai.com"


class OpenAIChatModel:
    """A ``Model`` that streams from ``POST {base_url}/chat/completions`` through the openai SDK.

    Args:
        model: the model name the endpoint knows (``"gpt-4o-mini"``, ``"qwen2.5:7b"``...).
        base_url: the API root, up to and including ``/v1``.
        api_key: the key to send; when ``None`` it is read from ``$api_key_env`` at every request
            (so a child process that calls its model itself uses its own environment). Aimed
            at the OpenAI API (``api.openai.com``), a model without a key fails before any
            request: at construction when neither ``api_key`` nor ``$api_key_env`` is set, and
            in ``stream()`` if the variable is gone by then. At any other ``base_url`` no
            ``Authorization`` header is sent when neither is set: local servers need none, and
            a server that does answers 401.
        api_key_env: the environment variable holding the key.
        retry: how the runtime retries this model's transient errors (see the module docstring).
        timeout: seconds allowed to connect (TCP, a proxy tunnel, TLS), to send the request, and
            for each read of the response (a server silent that long ends the call).
        deadline: seconds the whole call may take, from the request to the last event (a server
            that trickles, or sends interim responses without end, ends here).
        temperature: sent when not ``None``.
        max_tokens: sent when not ``None``.
        extra_body: extra JSON fields merged into every request body last (provider-specific
            options such as ``{"top_p": 0.9}`` or ``{"max_completion_tokens": 512}``).

    The object holds configuration only, so it pickles with ``pickle`` and ``cloudpickle`` and can
    be shipped to child processes (its SDK clients stay behind). It keeps one SDK client per event
    loop and configuration (``base_url``, ``timeout``, the proxy variables) and reuses it and its
    idle connections across calls; the key is read and sent per call. ``aclose()`` closes the
    client of the running loop; the others close when their loop shuts down
    (``zett_agent.models._sdk_clients``).

    Raises ``ImportError`` naming the install command when the ``openai`` extra is missing,
    ``ValueError`` for an unusable argument (empty model name, a base URL that is not http(s), a
    non-positive timeout or deadline, an ``extra_body`` that is not JSON-serialisable), or when
    aimed at the OpenAI API with no key (the one-line message says to set the variable or pass
    ``api_key=``).

    HTTP: ``https://`` certificates are verified against certifi's CA bundle, or
    ``$SSL_CERT_FILE`` / ``$SSL_CERT_DIR`` when set (read once per process). Proxies come from
    the environment (``$HTTPS_PROXY``, ``$HTTP_PROXY``, ``$ALL_PROXY``, ``$NO_PROXY``) as the
    SDK's HTTP library reads them (a change of one builds a new client). Redirects are not
    followed; a compressed body is refused.

    Bounds, so a hostile or broken server can make the adapter (in the parent, for every brokered
    child) neither hold much nor spin: an answer at most 64 MiB of body as received (every byte
    counts, keep-alives too), in lines of at most 8 MiB, at most 2 Mi line ends and 1 Mi events;
    a line longer than 64 KiB with at most 131072 commas and colons outside its strings; an
    error body read up to 1 MiB; one answer at most 1024 tool calls (``zett_agent.models.
    _budget``); the whole call within ``deadline``. Each is a ``ModelError`` that names it.

    Child processes: a brokered child (the default of ``ProcessRunner``) holds a keyless
    stand-in and the parent makes its calls (``brokerable``). A child that calls its model
    itself (``ProcessRunner(broker=False)``, Ray, in-process) imports the SDK; ``child_preload``
    names the module that imports it and builds the TLS context in a pool's launcher, so such
    children start warm and share that memory.
    """

    retry: RetryOptions
    #: modules a child that calls this model itself would import at its first request
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
        deadline: float = 600.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        require("openai", "OpenAIChatModel")
        if not model or not isinstance(model, str):
            raise ValueError(f"model must be a non-empty model name, got {model!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https://, got {base_url!r} "
                "(for example 'http://127.0.0.1:8000/v1')"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline!r}")
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
        self.deadline = float(deadline)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body: dict[str, Any] = body
        self._api_key = api_key
        self._clients = LoopClients()
        if self._needs_key() and self._resolve_key() is None:
            raise ValueError(self._missing_key_message())

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
        return server_attributes(self.base_url, PROVIDER_OPENAI)

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else f"${self.api_key_env}"
        return f"OpenAIChatModel({self.model!r}, base_url={self.base_url!r}, api_key={key})"

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("deadline", 600.0)
        state.pop("_ssl_context", None)  # pickled by an older version
        state.setdefault("_clients", LoopClients())  # pickled by an older version
        self.__dict__.update(state)

    async def aclose(self) -> None:
        """Close the SDK client of this event loop and its idle connections. Idempotent.

        The model stays usable: a later ``stream()`` builds a new client. Clients on other
        event loops close when their loop shuts down (``_sdk_clients``).
        """
        await self._clients.aclose()

    def _client_config(self) -> tuple[Any, ...]:
        """What this model's client is built from, read at every call (a change: a new client)."""
        return (self.base_url, self.timeout, *map(os.environ.get, PROXY_VARIABLES))

    def _new_client(self, openai: Any) -> KeyedClient:
        """A new SDK client (with the placeholder key) and where it puts the key."""
        client = openai.AsyncOpenAI(
            api_key=NO_KEY,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,  # one retry policy: the runtime's (RetryOptions)
            http_client=http_client(
                openai.DefaultAsyncHttpxClient, timeout=self.timeout, json_as_event=True
            ),
        )
        return KeyedClient.of(client)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one completion: text deltas as they arrive, then one completed event.

        Raises:
            TransientModelError: HTTP 408, 409, 429 or 5xx (``status`` set; a ``Retry-After``
                hint is quoted in the message), a connection that failed or dropped (a
                certificate that does not verify, a proxy that refused the tunnel), a timeout or
                the deadline (``status`` ``None``), a stream that ended before the response was
                complete, or an overload the stream reported. The runtime retries these per
                ``self.retry``.
            ModelError: (``retryable=False``) no API key while aimed at the OpenAI API (raised
                before anything is sent), any other HTTP error with the server's own message
                (401: check the API key; 404: check the model name and base URL; 400 for a
                conversation longer than the model's context says so), a response that could
                not be decoded (malformed HTTP, SSE or JSON, more than the bounds above, a
                compressed body), an error the stream reported, or a tool call whose arguments
                are not a JSON object (the message names the tool and quotes the text); a
                request that cannot be encoded (a message kind Chat Completions has no role for,
                tool parameters JSON cannot hold). Nothing but ``ModelError`` and
                ``CancelledError`` leaves this call.

        Text: a lone surrogate anywhere in ``request`` is sent as U+FFFD, and so is a lone
        surrogate escape the server sends (the text and tool calls yielded are valid Unicode).

        Cancellation: cancelling the consuming task, or closing the iterator early (``aclose()``,
        ``contextlib.aclosing``), closes the HTTP response and the connection before the
        cancellation propagates; the server sees the client go away.
        """
        openai = await loaded("openai", "OpenAIChatModel")
        try:
            body = build_request(
                self.model,
                request,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                extra_body=self.extra_body,
            )
        except (TypeError, ValueError, RecursionError) as exc:
            raise ModelError(
                f"cannot encode a request for {self.url}: {type(exc).__name__}: {exc}"
            ) from exc
        key = self._resolve_key()
        if not key and self._needs_key():
            raise ModelError(self._missing_key_message(), retryable=False)
        if key:
            where = "api_key=" if self._api_key is not None else f"${self.api_key_env}"
            try:
                check_key(key, where)
            except ValueError as exc:
                raise ModelError(str(exc)) from None
        call = Call(self.url, self.model, self.api_key_env, bool(key), self.timeout, self.deadline)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline
        stream: Any = None
        try:
            await tls_context_ready()
            client = await self._clients.get(
                self._client_config(), functools.partial(self._new_client, openai)
            )
            async with asyncio.timeout_at(deadline):
                stream = await post_stream(
                    openai, client.sdk, "/chat/completions", body, key_headers(client.places, key)
                )
            accumulator = ResponseAccumulator()
            async for chunk in paced(stream, deadline):
                text = accumulator.add_chunk(chunk)
                if text:
                    yield ModelEvent.text_delta(text)
            if accumulator.finish_reason is None:
                # No finish_reason: the connection closed mid-answer.
                raise TransientModelError(
                    f"the model endpoint {self.url} closed the stream before the response was "
                    "complete (no finish_reason)"
                )
            _note_response(accumulator)
            final = accumulator.response()
        except Exception as exc:
            error = model_error(exc, openai, call)
            if error is exc:
                raise
            raise error from exc
        finally:
            await close_quietly(stream)
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


def _note_response(accumulator: ResponseAccumulator) -> None:
    """Put what the response said of itself on the model call's span (when traced)."""
    notes: dict[str, str | list[str]] = {}
    if accumulator.response_id:
        notes[RESPONSE_ID] = accumulator.response_id
    if accumulator.response_model:
        notes[RESPONSE_MODEL] = accumulator.response_model
    if accumulator.finish_reason:
        notes[FINISH_REASONS] = [shorten(accumulator.finish_reason, 100)]
    if notes:
        note_model_call(notes)
