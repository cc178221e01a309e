"""The child's side of brokered model calls: ``BrokeredModel``, a model without a key.

A brokered child receives a ``BrokeredModel`` in place of each model the parent brokers for it
(see ``_broker``). It holds a slot number, the real model's name (for display) and its
``retry`` options, nothing else: no endpoint, no key. ``stream(request)`` sends the request to
the parent over the child's own channel (``zett_agent.process.emit``), and yields the events
the parent streams back through the child's inbox (``zett_agent.process._child._inbox``); an error
the parent reports is raised as the same kind of ``ModelError`` (transient or not), so the
child's runtime retries per ``retry`` as it would with the real model.

A brokered child relays: children it starts itself get stand-ins that point at its own broker,
which serves them through its stand-ins (``relaying()``). Imported by
brokered children: light (the runtime's data classes, the engine's child side).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from zett_agent._model import ModelError, ModelEvent, ModelRequest, RetryOptions
from zett_agent._text import valid_json
from zett_agent._tracing._trace_models import note_model_call
from zett_agent.runners._broker._wire import (
    KEY,
    TOPIC,
    BadRequest,
    decode_error,
    decode_response,
    encode_request,
)

__all__ = ["BrokeredModel", "relay_from_here", "relaying"]

#: this process runs a brokered child: the children it starts are brokered through it
_relaying = False


def relaying() -> bool:
    """Whether this process runs a brokered child.

    Whether this process runs a brokered child (so the children it starts must be
    brokered too, relaying through it). Set by ``run_pickled_child``, in the child only: a
    stand-in unpickled anywhere else (a test, a copy) changes nothing.
    """
    return _relaying


def relay_from_here() -> None:
    global _relaying
    _relaying = True


def _rebuild(
    slot: int, name: str, retry: RetryOptions, span_attributes: dict[str, Any] | None = None
) -> BrokeredModel:
    """How a stand-in is unpickled in the child."""
    return BrokeredModel(slot, name, retry, span_attributes)


class BrokeredModel:
    """A model whose calls the parent makes: the child's stand-in for a brokered model.

    ``model`` is the real model's name, for display; ``retry`` its retry options;
    ``span_attributes`` what the runtime's spans say of it (``zett_agent._tracing._tracer.
    model_attributes``: its provider, its server); ``slot`` which of the models brokered for
    this child it stands for. ``stream`` raises
    ``ModelError`` outside a brokered child (no parent serves it there).

    Cancellation: cancelling the consuming task, or closing the stream early, tells the parent
    to stop the call (its provider request is closed).
    """

    brokerable: ClassVar[bool] = True  # a child of this child relays through it
    child_preload: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        slot: int,
        name: str,
        retry: RetryOptions,
        span_attributes: dict[str, Any] | None = None,
    ) -> None:
        self.slot = slot
        self.model = name
        self.retry = retry
        self.span_attributes = dict(span_attributes or {})

    def __repr__(self) -> str:
        return f"BrokeredModel({self.model!r}, through the parent)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.slot, self.model, self.retry, self.span_attributes))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        # as JSON takes it (the parent sends it on as JSON), unwalked when it fits one frame
        from zett_agent.process._child._worker import emit_json as emit

        client = _client()
        call_id, answers = client.open()
        finished = False
        try:
            try:
                body = encode_request(request)
                call = {"op": "call", "id": call_id, "slot": self.slot}
                try:
                    emit({KEY: {**call, "request": body}})
                except TypeError:
                    # text no provider could take (a lone surrogate): sent as U+FFFD, as the
                    # model's own adapter would send it (a request the child could not encode
                    # is still refused below)
                    emit({KEY: {**call, "request": valid_json(body)}})
            except RuntimeError as exc:
                finished = True
                raise ModelError(
                    f"{self!r} works only inside a brokered child process: {exc}"
                ) from None
            except (TypeError, ValueError) as exc:
                finished = True
                raise ModelError(f"the request cannot be sent to the parent: {exc}") from None
            while True:
                answer = await answers.get()
                if "text" in answer:
                    yield ModelEvent.text_delta(str(answer["text"]))
                elif "done" in answer:
                    finished = True
                    try:
                        response = decode_response(answer["done"])
                    except (BadRequest, KeyError, TypeError, ValueError, IndexError) as exc:
                        raise ModelError(f"the parent sent a malformed response: {exc}") from None
                    notes = answer.get("notes")
                    if notes:  # what the parent's model said of its response, for our span
                        note_model_call(notes)
                    yield ModelEvent.completed(response)
                    return
                else:
                    finished = True
                    raise decode_error(answer.get("error") or {})
        finally:
            client.close(call_id)
            if not finished:
                _cancel(call_id)


def _cancel(call_id: int) -> None:
    from zett_agent.process import emit

    with contextlib.suppress(Exception):  # the channel is gone: so is the parent's call
        emit({KEY: {"op": "cancel", "id": call_id}})


class _Client:
    """The calls of one event loop: answers from the inbox, routed by call id to each stream.

    One pump task reads the broker's topic while calls are open and is cancelled when the
    last one closes (a cancelled receive takes no message; a late answer for a closed call is
    dropped by the next pump, and so is an answer without a call id: the parent's refusal of
    something no stream of this process sent).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self.counter = 0
        self.pump: asyncio.Task[None] | None = None

    def open(self) -> tuple[int, asyncio.Queue[dict[str, Any]]]:
        self.counter += 1
        answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.calls[self.counter] = answers
        if self.pump is None or self.pump.done():
            self.pump = self.loop.create_task(self._pump(), name="zett-agent-broker-answers")
        return self.counter, answers

    def close(self, call_id: int) -> None:
        self.calls.pop(call_id, None)
        if not self.calls and self.pump is not None:
            self.pump.cancel()
            self.pump = None

    async def _pump(self) -> None:
        from zett_agent.process._child._inbox import receive

        while self.calls:
            try:
                answer = await receive(TOPIC)
            except EOFError:
                gone = {"error": {"message": "the parent closed the channel (the child stops)"}}
                for answers in self.calls.values():
                    answers.put_nowait(gone)
                return
            if type(answer) is dict:
                target = self.calls.get(answer.get("id"))  # type: ignore[arg-type]
                if target is not None:
                    target.put_nowait(answer)


_clients: list[_Client] = []


def _client() -> _Client:
    loop = asyncio.get_running_loop()
    if not _clients or _clients[0].loop is not loop:
        _clients[:] = [_Client(loop)]
    return _clients[0]
