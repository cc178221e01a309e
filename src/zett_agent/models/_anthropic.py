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

import functools
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from zett_agent._model import ModelEvent, ModelRequest, RetryOptions, TransientModelError
from zett_agent._tracing._base import PROVIDER_ANTHROPIC
from zett_agent.models._anthropic_wire import MessageAccumulator, build_request
from zett_agent.models._sdk_http import sdk_client, server_attributes
from zett_agent.models._sdk_model import SdkApi, SdkModel, note_answer

__all__ = ["AnthropicModel"]  # re-exported by zett_agent.models.anthropic


class AnthropicModel(SdkModel):
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

    #: modules a child that calls this model itself would import at its first request
    child_preload: ClassVar[tuple[str, ...]] = ("zett_agent.models._anthropic_preload",)
    #: nothing in a request chooses the endpoint, the model name or the key
    brokerable: ClassVar[bool] = True
    _api: ClassVar[SdkApi] = SdkApi(
        sdk="anthropic",
        adapter="AnthropicModel",
        path="/v1/messages",
        api_host="api.anthropic.com",  # the Anthropic API itself, the one that always needs a key
        example_url="https://api.anthropic.com",
    )

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
        self.max_tokens = max_tokens
        self.temperature = temperature
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            api_key_env=api_key_env,
            retry=retry,
            timeout=timeout,
            deadline=deadline,
            extra_body=extra_body,
        )

    def _check_settings(self) -> None:
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {self.max_tokens!r}")

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/v1/messages``."""
        return f"{self.base_url}{self._api.path}"

    @property
    def span_attributes(self) -> dict[str, str | int]:
        """``gen_ai.provider.name`` ``anthropic``, ``server.address`` and ``server.port``."""
        return server_attributes(self.base_url, PROVIDER_ANTHROPIC)

    async def aclose(self) -> None:
        """Close the SDK client of this event loop and its idle connections. Idempotent.

        The model stays usable (a later ``stream()`` builds a new client); clients on other
        event loops close when their loop shuts down.
        """
        await self._clients.aclose()

    @staticmethod
    def _sdk_client(sdk: Any, base_url: str, timeout: float) -> Any:
        """A new ``AsyncAnthropic`` (with the placeholder key) on the budgeted HTTP client."""
        return sdk_client(
            sdk.AsyncAnthropic,
            sdk.DefaultAsyncHttpxClient,
            base_url=base_url,
            timeout=timeout,
            json_as_event=False,
            auth_token=None,
        )

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
        encode = functools.partial(
            build_request,
            self.model,
            request,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            extra_body=self.extra_body,
        )
        async with self._streamed(encode) as events:
            accumulator = MessageAccumulator()
            async for event in events:
                text = accumulator.take(event)
                if text:
                    yield ModelEvent.text_delta(text)
            if not accumulator.stopped and accumulator.stop_reason is None:
                raise TransientModelError(
                    f"the model endpoint {self.url} closed the stream before the message was "
                    "complete (no stop reason, no message_stop)"
                )
            note_answer(
                accumulator.response_id, accumulator.response_model, accumulator.stop_reason
            )
            final = accumulator.response()
        yield ModelEvent.completed(final)
