"""What the SDK adapters share: their configuration and key, a client per loop, one call's course.

``OpenAIChatModel`` and ``AnthropicModel`` are each an ``SdkModel`` with its ``SdkApi`` (the
SDK, the endpoint's path, the host that always needs a key, the wording of its messages), and
keep what differs between the APIs: their defaults and settings (``_check_settings``), their
SDK client (``_sdk_client``), the body of a request and how the stream's events make the answer
(their ``stream``). What is here once:

- the checks of the arguments every adapter has, and their messages;
- the key: ``api_key``, else ``$api_key_env`` read at every call, refused before anything is
  sent when the provider's own API is aimed at without one, or when no header can carry it;
- one SDK client per event loop and configuration (``_sdk_clients``), built on the HTTP client
  of ``_sdk_http``, closed by ``aclose()`` or with its loop;
- one call (``_streamed``): the body encoded, the request posted under the deadline, the
  answer's events read within the response budget (``_budget``), every failure mapped to a
  ``ModelError`` (``_sdk_errors``), the stream and its connection closed however it ends;
- ``repr`` (never the key) and pickling (the clients stay behind). The instance attributes are
  the ones each adapter had before it was built on this class, so a model pickled then still
  unpickles.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from zett_agent._model import ModelError, RetryOptions
from zett_agent._tracing._base import FINISH_REASONS, RESPONSE_ID, RESPONSE_MODEL
from zett_agent._tracing._trace_models import note_model_call
from zett_agent.models._budget import paced
from zett_agent.models._extras import loaded, require
from zett_agent.models._sdk_clients import LoopClients
from zett_agent.models._sdk_errors import Call, model_error
from zett_agent.models._sdk_http import (
    PROXY_VARIABLES,
    KeyedClient,
    check_key,
    client_ready,
    close_quietly,
    key_headers,
    post_stream,
)

__all__ = ["SdkApi", "SdkModel", "note_answer"]


@dataclass(frozen=True, slots=True)
class SdkApi:
    """What the shared code says of one provider's API and of the adapter that speaks it."""

    #: the SDK's package, and the extra that installs it
    sdk: str
    #: the adapter's class name, as its ``repr`` and messages say it
    adapter: str
    #: the endpoint's path below ``base_url``, where each call is posted
    path: str
    #: the host of the provider's own API, the one endpoint that always needs a key
    api_host: str
    #: a ``base_url`` the message for an unusable one gives as an example
    example_url: str
    #: what the message for a missing key adds after its fix
    key_hint: str = ""


class SdkModel:
    """The part of a model adapter on an official SDK that does not depend on the provider.

    Not a model by itself: a subclass sets ``_api``, its own settings before calling
    ``__init__``, ``_sdk_client``, and a ``stream`` that reads the events of ``_streamed``.
    """

    #: the provider's API, set by each adapter
    _api: ClassVar[SdkApi]
    retry: RetryOptions

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None,
        api_key_env: str,
        retry: RetryOptions,
        timeout: float,
        deadline: float,
        extra_body: Mapping[str, Any] | None,
    ) -> None:
        """Check and keep the configuration every adapter has (its own settings are set already).

        Raises ``ImportError`` naming the install command when the SDK's extra is missing,
        ``ValueError`` for an unusable argument (the adapter's own, checked by
        ``_check_settings``, after the shared ones), or when aimed at the provider's own API
        with no key.
        """
        api = self._api
        require(api.sdk, api.adapter)
        if not model or not isinstance(model, str):
            raise ValueError(f"model must be a non-empty model name, got {model!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https://, got {base_url!r} "
                f"(for example {api.example_url!r})"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline!r}")
        self._check_settings()
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
        self.extra_body: dict[str, Any] = body
        self._api_key = api_key
        self._clients = LoopClients()
        if self._needs_key() and self._resolve_key() is None:
            raise ValueError(self._missing_key_message())

    def _check_settings(self) -> None:
        """Raise ``ValueError`` for an unusable setting of the adapter's own (none by default)."""

    @staticmethod
    def _sdk_client(sdk: Any, base_url: str, timeout: float) -> Any:
        """A new client of the SDK module ``sdk``, built with ``NO_KEY`` (each adapter's own)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else f"${self.api_key_env}"
        return f"{self._api.adapter}({self.model!r}, base_url={self.base_url!r}, api_key={key})"

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_clients", LoopClients())  # pickled by an older version
        self.__dict__.update(state)

    def _client_config(self) -> tuple[Any, ...]:
        """What this model's client is built from, read at every call (a change: a new client)."""
        return (self.base_url, self.timeout, *map(os.environ.get, PROXY_VARIABLES))

    def _new_client(self, sdk: Any) -> KeyedClient:
        """A new SDK client (with the placeholder key) and where it puts the key."""
        return KeyedClient.of(self._sdk_client(sdk, self.base_url, self.timeout))

    def _resolve_key(self) -> str | None:
        if self._api_key is not None:
            return self._api_key
        return os.environ.get(self.api_key_env) or None

    def _needs_key(self) -> bool:
        """Whether requests go to the provider's own API (other endpoints may need no key)."""
        return (urlsplit(self.base_url).hostname or "").lower() == self._api.api_host

    def _missing_key_message(self) -> str:
        return (
            f"{self._api.adapter}({self.model!r}) has no API key for {self.base_url}: set "
            f"{self.api_key_env} in the environment or pass api_key=...{self._api.key_hint}"
        )

    def _call_key(self) -> str | None:
        """The key of one call, checked; ``ModelError`` when it is missing or unusable."""
        key = self._resolve_key()
        if not key and self._needs_key():
            raise ModelError(self._missing_key_message(), retryable=False)
        if key:
            where = "api_key=" if self._api_key is not None else f"${self.api_key_env}"
            try:
                check_key(key, where)
            except ValueError as exc:
                raise ModelError(str(exc)) from None
        return key

    async def warm_up(self) -> None:
        """Do, off the event loop, what this model's first call in this process does first.

        Import the SDK, and build the process's TLS context and a first client of its HTTP
        library (which imports the transport), each in a thread, once per process: a few
        hundred milliseconds the first time, nothing after. A brokering ``ProcessRunner``
        awaits it in the background as it warms up, so the parent's first brokered call does
        not wait for it. Raises what that call would (``ImportError`` naming the install
        command, ``OSError`` naming a CA bundle that cannot be loaded).
        """
        api = self._api
        sdk = await loaded(api.sdk, api.adapter)
        await client_ready(sdk.DefaultAsyncHttpxClient)

    @contextlib.asynccontextmanager
    async def _streamed(
        self, encode: Callable[[], dict[str, Any]]
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """One call: the body ``encode()`` makes, posted; the answer's events (JSON values).

        The events come within the deadline and the response budget. Whatever the ``with``
        block raises, as what this raises, leaves as a ``ModelError`` (``_sdk_errors``), and
        the stream and its connection are closed however the block ends (its cancellation
        too) before that propagates. Raises ``ModelError`` before anything is sent for a body
        that cannot be encoded (``TypeError``, ``ValueError``, ``RecursionError`` from
        ``encode``) or a key that is missing or unusable.
        """
        api = self._api
        sdk = await loaded(api.sdk, api.adapter)
        url = f"{self.base_url}{api.path}"
        try:
            body = encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise ModelError(
                f"cannot encode a request for {url}: {type(exc).__name__}: {exc}"
            ) from exc
        key = self._call_key()
        call = Call(url, self.model, self.api_key_env, bool(key), self.timeout, self.deadline)
        deadline = asyncio.get_running_loop().time() + self.deadline
        stream: Any = None
        try:
            await client_ready(sdk.DefaultAsyncHttpxClient)
            async with self._clients.lease(
                self._client_config(), functools.partial(self._new_client, sdk)
            ) as client:
                try:
                    async with asyncio.timeout_at(deadline):
                        stream = await post_stream(
                            sdk, client.sdk, api.path, body, key_headers(client.places, key)
                        )
                    yield paced(stream, deadline)
                finally:
                    await close_quietly(stream)  # the call's connection, before the lease ends
                    stream = None
        except Exception as exc:
            error = model_error(exc, sdk, call)
            if error is exc:
                raise
            raise error from exc
        finally:
            await close_quietly(stream)


def note_answer(response_id: str | None, model: str | None, reason: str | None) -> None:
    """Put what an answer said of itself on the model call's span (when traced)."""
    notes: dict[str, str | list[str]] = {}
    if response_id:
        notes[RESPONSE_ID] = response_id
    if model:
        notes[RESPONSE_MODEL] = model
    if reason:
        notes[FINISH_REASONS] = [reason]
    if notes:
        note_model_call(notes)
