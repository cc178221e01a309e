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

import functools
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from zett_agent._model import ModelEvent, ModelRequest, RetryOptions, TransientModelError
from zett_agent._tracing._base import PROVIDER_OPENAI
from zett_agent.models._openai_wire import ResponseAccumulator, build_request
from zett_agent.models._sdk_errors import shorten
from zett_agent.models._sdk_http import sdk_client, server_attributes
from zett_agent.models._sdk_model import SdkApi, SdkModel, note_answer

__all__ = ["OpenAIChatModel"]  # re-exported by zett_agent.models.openai


class OpenAIChatModel(SdkModel):
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

    #: modules a child that calls this model itself would import at its first request
    child_preload: ClassVar[tuple[str, ...]] = ("zett_agent.models._openai_preload",)
    #: a brokered child gets a keyless stand-in and the parent makes its calls: nothing in a
    #: request chooses the endpoint, the model name or the key
    #: (``zett_agent.runners._broker._parent``)
    brokerable: ClassVar[bool] = True
    _api: ClassVar[SdkApi] = SdkApi(
        sdk="openai",
        adapter="OpenAIChatModel",
        path="/chat/completions",
        api_host="api.openai.com",  # the OpenAI API itself, the one that always needs a key
        example_url="http://127.0.0.1:8000/v1",
        key_hint=" (a local OpenAI-compatible server needs none: pass its base_url=)",
    )

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
        self.temperature = temperature
        self.max_tokens = max_tokens
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

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/chat/completions``."""
        return f"{self.base_url}{self._api.path}"

    @property
    def span_attributes(self) -> dict[str, str | int]:
        """What the runtime's spans of this model say about it (``docs/tracing.md``).

        ``gen_ai.provider.name`` ``openai`` (the API this adapter speaks, whatever server
        answers it), ``server.address`` and ``server.port`` of ``base_url``.
        """
        return server_attributes(self.base_url, PROVIDER_OPENAI)

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("deadline", 600.0)  # pickled by an older version
        state.pop("_ssl_context", None)  # pickled by an older version
        super().__setstate__(state)

    async def aclose(self) -> None:
        """Close the SDK client of this event loop and its idle connections. Idempotent.

        The model stays usable: a later ``stream()`` builds a new client. Clients on other
        event loops close when their loop shuts down (``_sdk_clients``).
        """
        await self._clients.aclose()

    @staticmethod
    def _sdk_client(sdk: Any, base_url: str, timeout: float) -> Any:
        """A new ``AsyncOpenAI`` (with the placeholder key) on the budgeted HTTP client."""
        return sdk_client(
            sdk.AsyncOpenAI,
            sdk.DefaultAsyncHttpxClient,
            base_url=base_url,
            timeout=timeout,
            json_as_event=True,
        )

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
        encode = functools.partial(
            build_request,
            self.model,
            request,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            extra_body=self.extra_body,
        )
        async with self._streamed(encode) as chunks:
            accumulator = ResponseAccumulator()
            async for chunk in chunks:
                text = accumulator.add_chunk(chunk)
                if text:
                    yield ModelEvent.text_delta(text)
            if accumulator.finish_reason is None:
                # No finish_reason: the connection closed mid-answer.
                raise TransientModelError(
                    f"the model endpoint {self.url} closed the stream before the response was "
                    "complete (no finish_reason)"
                )
            reason = accumulator.finish_reason
            note_answer(accumulator.response_id, accumulator.response_model, shorten(reason, 100))
            final = accumulator.response()
        yield ModelEvent.completed(final)
