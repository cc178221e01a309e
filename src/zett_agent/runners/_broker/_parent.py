"""Brokered model calls: a child's model requests made by its parent, with the parent's key.

A child whose spec is brokered (``ChildSpec.broker``, or ``ProcessRunner(broker=True)``) is
shipped with every brokerable model in it replaced by a keyless ``BrokeredModel``
(``_standin``): the definition's model, the spec's model (the parent's, for ``model=None``),
and any other brokerable model anywhere in what is pickled (the definitions of a nested
subagent extension, a tool's closure, ``child_state()``). The replacement happens inside the
pickler (``pickle_brokered``), so no brokerable model object, and no key it holds, is written
into what the child receives. The ``Broker`` then serves that child's requests in the parent,
with the real models, and streams the events back through ``ProcessJob.send``.

**Opting in.** A model class declares it can be brokered with a class attribute
``brokerable = True`` (``OpenAIChatModel`` does). It promises that its ``stream()`` may run in
the parent's event loop for any number of children at once, and that nothing in a
``ModelRequest`` chooses its endpoint, model name or credentials (they are the parent's
configuration). Its ``retry`` is copied to the stand-in, and its ``model`` attribute, when a
``str``, names the stand-in for display; what its spans say of it (``span_attributes``: its
provider, its server) goes on the stand-in's spans. Models without the attribute are shipped as they
are (the child holds what they hold), as without brokering.

**Children of children.** A brokered child relays: the stand-ins of its own children point at
its own broker, which serves them with its stand-ins, up to the parent. The parent serves only
the models it brokered for that child (its slots), so a child can never ask for anything else.

**What the parent bounds per child** (module constants, the limits of one ``Broker``):
``MAX_REQUEST_BYTES`` per request (the engine's estimate of its decoded size), ``MAX_CALLS``
calls at once (beyond: a transient error, which the child's runtime retries), and what waits
to be sent: the engine's ``SEND_BUFFER_BYTES`` per job (a call whose child does not read waits,
and so does its provider stream), plus at most ``MAX_NOTICES`` queued refusals. A request that
breaks a rule gets an error answer naming the rule; nothing a child sends raises on the
parent's path. A request is checked as hostile data (exact keys, exact types) a slice at a
time, at most 2 ms per event-loop callback, as the engine decodes frames. When the child ends
(completes, fails, is killed or cancelled) every call it had open is cancelled, which closes
its provider request.

**Ready before the first call.** A brokerable model may also define ``async warm_up()``: what
its first call in a process does once (``OpenAIChatModel`` and ``AnthropicModel`` import their
SDK and build the TLS context, a few hundred milliseconds). A brokering ``ProcessRunner`` awaits
it for the models the extension tells it of (``warm_up_models``) in the background as it warms
up, beside its pool's start, so the first child's first call does not wait for it; a failure
there is left for that call to report, and closing the runner cancels a warm-up still under way.

**Many calls at once take turns.** Before a call reads its next event it asks ``models._pacing``
whether the loop's relaying budget for this turn (a quarter of a millisecond) is spent; if so
it waits for a later loop iteration, a call per iteration in the order they came, so the
parent's timers and other work run between turns however many children stream at once.

**What a call costs the child** (its token budget trusts these counts): each call is charged
once, as it ends, whatever ends it (completed, closed or cancelled by the child, the child's
death, an error, ``close()``): the usage its model reported, else an estimate from the request
and what streamed (``_broker_usage``). A call under way holds its estimate in the counts, and
the budget (``on_usage``) is asked before each call is made, with that call's input estimate,
so parallel calls cannot each pass under it; then every ``_TELL_EVERY`` estimated output tokens
and before the child gets a completed response. A budget that says stop closes the broker.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from zett_agent._model import Model, ModelError, ModelEventKind, ModelRequest, TransientModelError
from zett_agent._tracing._trace_models import ModelNotes, model_attributes
from zett_agent.models._pacing import pace
from zett_agent.runners._broker._standin import _rebuild
from zett_agent.runners._broker._usage import (
    CallCharge,
    estimated_tokens,
    request_chars_in_steps,
    response_chars,
)
from zett_agent.runners._broker._wire import (
    KEY,
    MAX_ID,
    TOPIC,
    BadRequest,
    decode_request_in_steps,
    encode_error,
    encode_event,
)

if TYPE_CHECKING:
    from zett_agent.process import ProcessJob

__all__ = [
    "MAX_CALLS",
    "MAX_NOTICES",
    "MAX_REQUEST_BYTES",
    "Broker",
    "brokerable",
    "pickle_brokered",
    "warm_up_models",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: largest request a child may send (the engine's upper bound of its decoded size, in bytes)
MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: model calls one child may have open at once
MAX_CALLS = 4
#: refusals waiting to be sent to one child; beyond, refusals are dropped (counted)
MAX_NOTICES = 64
#: longest model name a stand-in shows
_MAX_NAME = 200
#: longest stretch of checking one request in one event-loop callback
_SLICE = 0.002
#: estimated output tokens a streaming call adds before the budget hears of them again
_TELL_EVERY = 256


def brokerable(model: object) -> bool:
    """Whether ``model``'s class declares it can be brokered (``brokerable = True``)."""
    return getattr(type(model), "brokerable", False) is True


class _BrokerPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, with every brokerable model replaced by a stand-in as it is met."""

    def __init__(self, file: io.BytesIO, models: list[Model]) -> None:
        super().__init__(file, protocol=cloudpickle.DEFAULT_PROTOCOL)
        self.models = models
        self.slots: dict[int, int] = {}

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, type) and brokerable(obj):
            slot = self.slots.get(id(obj))
            if slot is None:
                slot = self.slots[id(obj)] = len(self.models)
                self.models.append(obj)
            return (_rebuild, (slot, _name(obj), obj.retry, model_attributes(obj)))
        return super().reducer_override(obj)


def _name(model: object) -> str:
    name = getattr(model, "model", None)
    if not isinstance(name, str):
        name = type(model).__name__
    return name[:_MAX_NAME]


def pickle_brokered(obj: object) -> tuple[bytes, list[Model]]:
    """Pickle an object with its brokerable models replaced.

    ``obj`` pickled with cloudpickle, each brokerable model in it (at any depth) replaced by
    a ``BrokeredModel`` whose slot is its index in the returned list of real models.

    Raises what cloudpickle raises for an object it cannot pickle.
    """
    models: list[Model] = []
    with io.BytesIO() as file:
        _BrokerPickler(file, models).dump(obj)
        return file.getvalue(), models


async def warm_up_models(models: Iterable[object]) -> None:
    """Await ``warm_up()`` of each model that has one, in turn; never raises.

    A model whose warm-up fails (its SDK missing, a CA bundle that cannot be loaded) is left
    for its first call, which raises the same error where the caller sees it.
    """
    for model in models:
        warm_up = getattr(model, "warm_up", None)
        if not callable(warm_up):
            continue
        try:
            await warm_up()
        except Exception:
            log.debug("warming up %r failed; its first call will say why", model, exc_info=True)


class Broker:
    """Serves one child's model requests with ``models`` (its slots), through ``job``.

    ``accept`` is the job's event filter: it takes the child's broker events and leaves its
    progress to the extension. Call ``close()`` when the job ends (the runner does, from the
    job's done callback) and await ``wait_closed()`` to know every provider request is closed;
    ``on_idle(broker)`` is called once it is closed and its last call has ended.
    """

    def __init__(
        self,
        job: ProcessJob,
        models: Sequence[Model],
        on_idle: Callable[[Broker], object] | None = None,
    ) -> None:
        self._job = job
        self._on_idle = on_idle
        self._models = tuple(models)
        self._loop = asyncio.get_running_loop()
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._notices: deque[dict[str, Any]] = deque()
        self._notifier: asyncio.Task[None] | None = None
        self._closed = False
        #: the tokens of the child's calls: each ended call's charge (the usage its model
        #: reported, else an estimate: ``_broker_usage``), plus the estimate each open call
        #: holds so far; the child's token budget trusts these
        self.input_tokens = 0
        self.output_tokens = 0
        #: the counts ``on_usage`` was last called with
        self._told = (0, 0)
        #: ``on_usage(more)``, on the loop: the counts above changed (``more=0``), or a call
        #: estimated at ``more`` input tokens is about to be made; ``False`` stops the child's
        #: calls (``close()``), that one first
        self.on_usage: Callable[[int], object] | None = None
        #: calls served (started), refused, and refusals dropped (more than MAX_NOTICES queued)
        self.calls = 0
        self.refused = 0
        self.dropped = 0

    @property
    def busy(self) -> bool:
        """Whether calls (or refusals to send) are still open."""
        return bool(self._calls) or self._notifier is not None

    def info(self) -> dict[str, int]:
        """Counts for ``task_info``: calls started, requests refused."""
        return {"calls": self.calls, "refused": self.refused}

    # -- from the child (on the event loop, synchronously, for every event) -------------------

    def accept(self, value: Any, cost: int) -> bool:
        """Take ``value`` if it is a broker event (then answer it); leave anything else.

        Never raises: whatever the child sent, the worst outcome is an error answer.
        """
        if type(value) is not dict or KEY not in value:
            return False
        try:
            self._handle(value[KEY], cost)
        except Exception:  # a bug here must not become the child's weapon against the parent
            log.exception("the model broker failed on a request of %r", self._job)
        return True

    def _handle(self, message: object, cost: int) -> None:
        if self._closed:
            return
        if type(message) is not dict:
            self._refuse(None, f"a broker message must be an object, got {_short(message)}")
            return
        call_id = message.get("id")
        if type(call_id) is not int or not 0 <= call_id < MAX_ID:
            self._refuse(
                None, f"a broker message needs an integer id in [0, 2**53), got {_short(call_id)}"
            )
            return
        op = message.get("op")
        if op == "cancel":
            task = self._calls.get(call_id)
            if task is not None:
                task.cancel()
            return
        if op != "call":
            self._refuse(call_id, f"unknown broker op {_short(op)}; known: call, cancel")
            return
        if message.keys() != {"op", "id", "slot", "request"}:
            self._refuse(call_id, "a call must have exactly the keys op, id, slot, request")
            return
        if call_id in self._calls:
            self._refuse(call_id, f"call id {call_id} is already in use by an open call")
            return
        if len(self._calls) >= MAX_CALLS:
            self._refuse(
                call_id,
                f"the child already has {len(self._calls)} model calls open, the most the "
                f"parent serves at once ({MAX_CALLS}); retry when one ended",
                retryable=True,
            )
            return
        if cost > MAX_REQUEST_BYTES:
            self._refuse(
                call_id,
                f"the request is too large for the parent to relay (about {cost} bytes, at "
                f"most {MAX_REQUEST_BYTES}); shorten the conversation or the tool results",
            )
            return
        slot = message["slot"]
        if type(slot) is not int or not 0 <= slot < len(self._models):
            self._refuse(
                call_id, f"slot {_short(slot)} is not a model the parent brokers for this child"
            )
            return
        # the request's envelope and first slice are checked here: a malformed request is
        # refused at once, without taking a slot; a large one goes on in its call's task
        steps = decode_request_in_steps(message["request"])
        try:
            next(steps)
            request: ModelRequest | Generator[None, None, ModelRequest] = steps
        except StopIteration as done:
            request = done.value
        except BadRequest as exc:
            self._refuse(call_id, f"malformed request: {exc}")
            return
        charge = CallCharge()
        task = self._loop.create_task(
            self._serve(call_id, self._models[slot], request, charge),
            name=f"zett-agent-broker-call-{call_id}",
        )
        self._calls[call_id] = task
        # a callback, not a ``finally``: a task cancelled before it started never runs one
        task.add_done_callback(lambda _task: self._ended(call_id, task, charge))

    # -- to the child -------------------------------------------------------------------------

    async def _in_slices(self, steps: Generator[None, None, _T]) -> _T:
        """Run ``steps`` to its end, a slice at a time.

        At most ``_SLICE`` seconds per loop iteration, like the engine's own decoding; raises
        what ``steps`` raises.
        """
        deadline = time.perf_counter() + _SLICE
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: _T = done.value
                return result
            if time.perf_counter() > deadline:
                await asyncio.sleep(0)
                deadline = time.perf_counter() + _SLICE

    async def _serve(
        self,
        call_id: int,
        model: Model,
        pending: ModelRequest | Generator[None, None, ModelRequest],
        charge: CallCharge,
    ) -> None:
        """Stream one call of the child from ``model``; its events, or its error, go back.

        What the call is charged is settled by ``_ended``; here it holds an estimate as it
        goes, and the child's budget is asked before the call is made, every ``_TELL_EVERY``
        estimated output tokens, and before the completed response reaches the child. When the
        budget says stop, the call ends without a word to the child (which is being stopped).
        """
        if isinstance(pending, ModelRequest):
            request = pending
        else:
            try:
                request = await self._in_slices(pending)
            except BadRequest as exc:
                self.refused += 1
                await self._send_error(call_id, ModelError(f"malformed request: {exc}"))
                return
        charge.input_chars = await self._in_slices(request_chars_in_steps(request))
        if self._closed or not self._tell(estimated_tokens(charge.input_chars)):
            return  # the child's budget cannot take this call: it is not made (nor charged)
        self._charge(charge, charge.estimate())  # the call holds its input from now on
        if not self._tell():
            return
        self.calls += 1
        charge.reached = True
        notes = ModelNotes()
        notes.collect()  # what the model notes for its span goes to the child with the answer
        try:
            stream = model.stream(request)
            completed = False
            try:
                async for event in stream:
                    if event.kind is ModelEventKind.COMPLETED:
                        response = event.response
                        charge.streamed = True
                        if response is not None:
                            charge.reported = response.usage
                            if response.usage is None:
                                chars = response_chars(response.message)
                                charge.output_chars = max(charge.output_chars, chars)
                        self._charge(charge, charge.final())
                        if not self._tell():  # before the child has it: a budget acts first
                            return
                    elif event.kind is ModelEventKind.TEXT_DELTA:
                        charge.streamed = True
                        charge.output_chars += len(event.text)
                        self._charge(charge, charge.estimate())
                        if self.output_tokens - self._told[1] >= _TELL_EVERY and not self._tell():
                            return
                    answer = encode_event(call_id, event)
                    if event.kind is ModelEventKind.COMPLETED and notes.attributes:
                        answer["notes"] = notes.attributes
                    if not await self._send(answer):
                        return
                    if event.kind is ModelEventKind.COMPLETED:
                        completed = True
                        break
                    await pace()  # before the next read: many calls at once take turns
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()  # the provider request is closed before anything else
            if not completed:
                await self._send_error(
                    call_id,
                    ModelError(
                        f"the parent's model ({_name(model)}) ended its stream without a "
                        "completed response"
                    ),
                )
        except ModelError as exc:
            if exc.status is not None and not charge.streamed:
                charge.refused = True  # an HTTP error answer: the provider did no work
            await self._send_error(call_id, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "the brokered model %s raised for %r", _name(model), self._job, exc_info=True
            )
            await self._send_error(
                call_id,
                ModelError(f"the parent's model failed ({type(exc).__name__}: {_short(str(exc))})"),
            )

    # -- the count ----------------------------------------------------------------------------

    def _charge(self, charge: CallCharge, amounts: tuple[int, int]) -> None:
        """Make ``charge`` count for ``amounts``: the one place the totals change."""
        self.input_tokens += amounts[0] - charge.input_tokens
        self.output_tokens += amounts[1] - charge.output_tokens
        charge.input_tokens, charge.output_tokens = amounts

    def _tell(self, more: int = 0) -> bool:
        """Tell ``on_usage`` the counts (and ``more``); whether the child's calls may go on.

        ``False`` once the broker is closed; an answer ``False`` closes it. A callback that
        raises is logged and taken as yes.
        """
        self._told = (self.input_tokens, self.output_tokens)
        on_usage = self.on_usage
        if on_usage is not None:
            try:
                go_on = on_usage(more) is not False
            except Exception:
                log.exception("a usage callback of the model broker raised; ignored")
                go_on = True
            if not go_on:
                self.close()
        return not self._closed

    async def _send(self, answer: dict[str, Any]) -> bool:
        """Send one answer (waiting while the child does not read).

        ``False`` once the child can take none (it ended or is being killed: ``close()`` cancels its
        calls).
        """
        try:
            await self._job.send(answer, topic=TOPIC)
        except RuntimeError:
            return False
        except ValueError as exc:  # larger than a job's messages may be
            error = ModelError(f"the model's answer is too large to relay to the child: {exc}")
            return await self._send_error(answer.get("id"), error)
        return True

    async def _send_error(self, call_id: int | None, error: ModelError) -> bool:
        return await self._send(encode_error(call_id, error))

    def _refuse(self, call_id: int | None, reason: str, *, retryable: bool = False) -> None:
        """Answer a request that breaks a rule, through one task and a bounded queue."""
        self.refused += 1
        if len(self._notices) >= MAX_NOTICES:
            self.dropped += 1
            return
        error = TransientModelError(reason) if retryable else ModelError(reason)
        self._notices.append(encode_error(call_id, error))
        # a notifier that just finished may not have run its done callback yet
        if self._notifier is None or self._notifier.done():
            self._start_notifier()

    def _start_notifier(self) -> None:
        self._notifier = self._loop.create_task(self._notify(), name="zett-agent-broker-refusals")
        self._notifier.add_done_callback(self._notified)

    async def _notify(self) -> None:
        while self._notices:
            if not await self._send(self._notices[0]):
                self._notices.clear()
                return
            self._notices.popleft()

    def _ended(self, call_id: int, task: asyncio.Task[None], charge: CallCharge) -> None:
        """A call's task ended, however it did: its charge is settled here, once."""
        if self._calls.get(call_id) is task:
            del self._calls[call_id]
        self._charge(charge, charge.final())
        if (self.input_tokens, self.output_tokens) != self._told:
            self._tell()
        self._check_idle()

    def _notified(self, task: asyncio.Task[None]) -> None:
        if self._notifier is task:
            self._notifier = None
            if self._notices and not self._closed:
                self._start_notifier()
        self._check_idle()

    # -- the end ------------------------------------------------------------------------------

    def close(self, _job: object = None) -> None:
        """Stop serving.

        Cancel every open call (closing its provider request) and the refusals still to send.
        Idempotent; usable as the job's done callback.
        """
        self._closed = True
        current = asyncio.current_task(self._loop)
        for task in list(self._calls.values()):
            if task is not current:  # a call that closed the broker ends by itself
                task.cancel()
        if self._notifier is not None:
            self._notifier.cancel()
        self._notices.clear()
        self._check_idle()

    def _check_idle(self) -> None:
        if self._closed and not self.busy and self._on_idle is not None:
            on_idle, self._on_idle = self._on_idle, None
            on_idle(self)

    async def wait_closed(self) -> None:
        """Return once every call task ended (after ``close()``).

        Each provider request is closed by then. Cancelling the caller leaves the tasks to end on
        their own.
        """
        tasks = [*self._calls.values()]
        if self._notifier is not None:
            tasks.append(self._notifier)
        if tasks:
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))


def _short(value: object, limit: int = 80) -> str:
    """A short quote of a value a child sent.

    Never ``repr`` of a container (that would cost the parent's loop time in the size of whatever
    the child made).
    """
    if isinstance(value, str):
        return (
            repr(value)
            if len(value) <= limit
            else f"{value[:limit]!r}... ({len(value)} characters)"
        )
    if isinstance(value, bool | float) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**20 else "a very large integer"
    return f"a {type(value).__name__}"
