"""A model for Anthropic's Messages API (Claude), on the official ``anthropic`` SDK.

```python
from zett_agent.models.anthropic import AnthropicModel

model = AnthropicModel("claude-sonnet-4-5")                        # key from $ANTHROPIC_API_KEY
```

The ``anthropic`` extra: ``pip install 'zett-agent[anthropic]'``. Streaming Messages with the
system prompt, tool use and tool results (``_anthropic_wire``), usage with the prompt cache's
tokens, the stop reason on the model call's span. As ``OpenAIChatModel``: the SDK's retries are
off (one HTTP request per ``stream()``; the runtime retries a ``TransientModelError`` per
``retry``), every call has a deadline and the response budget of ``zett_agent.models._budget``,
and a brokered child holds a keyless stand-in while the parent makes its calls.
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
from zett_agent._tracing._base import (
    FINISH_REASONS,
    PROVIDER_ANTHROPIC,
    RESPONSE_ID,
    RESPONSE_MODEL,
)
from zett_agent._tracing._trace_models import note_model_call
from zett_agent.models._anthropic_wire import MessageAccumulator, build_request
from zett_agent.models._budget import paced
from zett_agent.models._extras import loaded, require
from zett_agent.models._sdk_clients import LoopClients
from zett_agent.models._sdk_errors import Call, model_error
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

__all__ = ["AnthropicModel"]  # re-exported by zett_agent.models.anthropic

#: The host of the Anthropic API itself, the one endpoint that always needs a key.
_ANTHROPIC_API_HOST = "api.anthropic.com"


class AnthropicModel:
    """A ``Model`` that streams from ``POST {base_url}/v1/messages`` through the anthropic SDK.

    Args:
        model: the model name (``"claude-sonnet-4-5"``, ``"claude-haiku-4-5"``...).
        base_url: the API root, without ``/v1`` (the SDK adds it).
        api_key: the key to send; when ``None`` it is read from ``$api_key_env`` at every
            request. Aimed at the Anthropic API (``api.anthropic.com``), a model without a key
            fails before any request: at construction when neither is set, and in ``stream()``
            if the variable is gone by then. At any other ``base_url`` no key header is sent
            when neither is set.
        api_key_env: the environment variable holding the key.
        retry: how the runtime retries this model's transient errors.
        timeout: seconds allowed to connect, to send the request, and for each read.
        deadline: seconds the whole call may take, from the request to the last event.
        max_tokens: the most tokens the answer may have (the API requires a bound).
        temperature: sent when not ``None``.
        extra_body: extra JSON fields merged into every request body last (``{"thinking":
            {...}}``, ``{"top_k": 5}``...).

    Pickles without its SDK clients. It keeps one per event loop and configuration and reuses
    it across calls (the key is sent per call); ``aclose()`` closes the running loop's, the
    others close with their loop (as ``OpenAIChatModel``).

    Raises ``ImportError`` naming the install command when the ``anthropic`` extra is missing,
    ``ValueError`` for an unusable argument, or when aimed at the Anthropic API with no key.
    """

    retry: RetryOptions
    #: modules a child that calls this model itself would import at its first request
    child_preload: ClassVar[tuple[str, ...]] = ("zett_agent.models._anthropic_preload",)
    #: nothing in a request chooses the endpoint, the model name or the key
    brokerable: ClassVar[bool] = True

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        retry: RetryOptions = RetryOptions(),  # noqa: B008 (frozen, so sharing the default is safe)
        timeout: float = 60.0,
        deadline: float = 600.0,
        max_tokens: int = 4096,
        temperature: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        require("anthropic", "AnthropicModel")
        if not model or not isinstance(model, str):
            raise ValueError(f"model must be a non-empty model name, got {model!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https://, got {base_url!r} "
                "(for example 'https://api.anthropic.com')"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline!r}")
        if type(max_tokens) is not int or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
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
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.extra_body: dict[str, Any] = body
        self._api_key = api_key
        self._clients = LoopClients()
        if self._needs_key() and self._resolve_key() is None:
            raise ValueError(self._missing_key_message())

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/v1/messages``."""
        return f"{self.base_url}/v1/messages"

    @property
    def span_attributes(self) -> dict[str, str | int]:
        """``gen_ai.provider.name`` ``anthropic``, ``server.address`` and ``server.port``."""
        return server_attributes(self.base_url, PROVIDER_ANTHROPIC)

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else f"${self.api_key_env}"
        return f"AnthropicModel({self.model!r}, base_url={self.base_url!r}, api_key={key})"

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_clients", LoopClients())  # pickled by an older version
        self.__dict__.update(state)

    async def aclose(self) -> None:
        """Close the SDK client of this event loop and its idle connections. Idempotent.

        The model stays usable (a later ``stream()`` builds a new client); clients on other
        event loops close when their loop shuts down.
        """
        await self._clients.aclose()

    def _client_config(self) -> tuple[Any, ...]:
        """What this model's client is built from, read at every call (a change: a new client)."""
        return (self.base_url, self.timeout, *map(os.environ.get, PROXY_VARIABLES))

    def _new_client(self, anthropic: Any) -> KeyedClient:
        """A new SDK client (with the placeholder key) and where it puts the key."""
        client = anthropic.AsyncAnthropic(
            api_key=NO_KEY,
            auth_token=None,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,  # one retry policy: the runtime's (RetryOptions)
            http_client=http_client(
                anthropic.DefaultAsyncHttpxClient, timeout=self.timeout, json_as_event=False
            ),
        )
        return KeyedClient.of(client)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one message: text deltas as they arrive, then one completed event.

        Raises:
            TransientModelError: HTTP 408, 409, 429, 5xx or 529 (overloaded; ``status`` set, a
                ``Retry-After`` hint quoted), an overloaded or failing stream, a connection that
                failed or dropped, a timeout or the deadline, or a stream that ended before its
                ``message_stop``. The runtime retries these per ``self.retry``.
            ModelError: (``retryable=False``) no key while aimed at the Anthropic API, any other
                HTTP error with the server's message (401, 403, 404 with their fixes; a prompt
                longer than the model's context said so), a response that could not be decoded
                or crossed the budget, a tool use whose input is not a JSON object, or a request
                that cannot be encoded. Nothing but ``ModelError`` and ``CancelledError`` leaves
                this call.

        Cancellation: closing the iterator or cancelling its consumer closes the response and
        the connection before the cancellation propagates.
        """
        anthropic = await loaded("anthropic", "AnthropicModel")
        try:
            body = build_request(
                self.model,
                request,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
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
        deadline = asyncio.get_running_loop().time() + self.deadline
        stream: Any = None
        try:
            await tls_context_ready()
            client = await self._clients.get(
                self._client_config(), functools.partial(self._new_client, anthropic)
            )
            async with asyncio.timeout_at(deadline):
                stream = await post_stream(
                    anthropic, client.sdk, "/v1/messages", body, key_headers(client.places, key)
                )
            accumulator = MessageAccumulator()
            async for event in paced(stream, deadline):
                text = accumulator.add_event(event)
                if text:
                    yield ModelEvent.text_delta(text)
            if not accumulator.stopped and accumulator.stop_reason is None:
                raise TransientModelError(
                    f"the model endpoint {self.url} closed the stream before the message was "
                    "complete (no stop reason, no message_stop)"
                )
            _note_response(accumulator)
            final = accumulator.response()
        except Exception as exc:
            error = model_error(exc, anthropic, call)
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
        return (urlsplit(self.base_url).hostname or "").lower() == _ANTHROPIC_API_HOST

    def _missing_key_message(self) -> str:
        return (
            f"AnthropicModel({self.model!r}) has no API key for {self.base_url}: set "
            f"{self.api_key_env} in the environment or pass api_key=..."
        )


def _note_response(accumulator: MessageAccumulator) -> None:
    """Put what the message said of itself on the model call's span (when traced)."""
    notes: dict[str, str | list[str]] = {}
    if accumulator.response_id:
        notes[RESPONSE_ID] = accumulator.response_id
    if accumulator.response_model:
        notes[RESPONSE_MODEL] = accumulator.response_model
    if accumulator.stop_reason:
        notes[FINISH_REASONS] = [accumulator.stop_reason]
    if notes:
        note_model_call(notes)
