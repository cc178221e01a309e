"""What the runtime's spans say about a model: its name, its provider, its server, its answer.

``model_attributes`` (what a ``chat`` span starts with) and ``agent_attributes`` (the model
and provider of an ``invoke_agent`` span) read the model object: its ``model`` name, and the
``span_attributes`` mapping a model may declare (the OpenAI adapter's provider and server).
``note_model_call`` is how a model adds what only its response says (the response's id, model
and finish reasons) to the span of the call running now:
``zett_agent._tracing._tracer.model_stream``
makes that span the target while the model computes, the parent's broker a ``ModelNotes``
that travels to the child with the response.

Light (imported by every agent, children included). Never raises into the runtime.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from zett_agent._tracing._base import (
    PROVIDER,
    PROVIDER_UNKNOWN,
    REQUEST_MODEL,
    clean_attributes,
    text,
)

if TYPE_CHECKING:
    from zett_agent._tracing._base import Attributes

__all__ = [
    "ModelNotes",
    "agent_attributes",
    "model_attributes",
    "model_name",
    "note_model_call",
    "noting",
]

log = logging.getLogger("zett_agent.tracing")
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, exc_info=True)


#: wrappers looked through to the model they wrap, at most
_MAX_WRAPPERS = 8


def _unwrapped(model: object) -> object:
    """``model`` itself, or the model a wrapper of it holds.

    A wrapper names what it wraps in ``__wrapped__``, the standard library's convention
    (``functools.wraps``): a child's progress wrapper (``ProgressModel``) does. Followed a few
    levels at most, so a wrapper naming itself cannot loop.
    """
    for _ in range(_MAX_WRAPPERS):
        try:
            inner = model.__dict__.get("__wrapped__") if hasattr(model, "__dict__") else None
        except Exception:  # a __dict__ of the application's model class that raised
            return model
        if inner is None or inner is model:
            return model
        model = inner
    return model


def model_name(model: object) -> str:
    """Return what a model calls itself, for span names.

    Its ``model`` attribute when that is a string (the adapters' model id), else its class
    name; a child's progress wrapper is looked through.
    """
    model = _unwrapped(model)
    try:
        name = getattr(model, "model", None)
    except Exception:  # a property of the application's model class that raised
        name = None
    return text(name if isinstance(name, str) and name else type(model).__name__, 128)


def model_attributes(model: object) -> dict[str, Any]:
    """Return the attributes that say which model ``model`` is and who serves it.

    ``gen_ai.request.model`` (``model_name``) and ``gen_ai.provider.name``, with what the model
    declares in a ``span_attributes`` mapping of its own (the OpenAI adapter declares its
    provider, ``server.address`` and ``server.port``), through ``clean_attributes``. A model
    that declares no provider has ``zett_agent`` (``PROVIDER_UNKNOWN``). For its model-call
    spans, and (provider and model only) its agent's. Never raises.
    """
    model = _unwrapped(model)
    declared: dict[str, Any] = {}
    try:
        declared = clean_attributes(getattr(model, "span_attributes", None))
    except Exception:
        _warn_once("model", "a model's span_attributes could not be read; they are left out")
    provider = declared.get(PROVIDER)
    if not isinstance(provider, str) or not provider:
        declared[PROVIDER] = PROVIDER_UNKNOWN
    declared[REQUEST_MODEL] = model_name(model)
    return declared


def agent_attributes(model: object) -> dict[str, Any]:
    """The attributes of an agent's ``invoke_agent`` span that name its model and provider."""
    attributes = model_attributes(model)
    return {PROVIDER: attributes[PROVIDER], REQUEST_MODEL: attributes[REQUEST_MODEL]}


class _Noted(Protocol):
    """What ``note_model_call`` writes to: a model call's span, or a broker's ``ModelNotes``."""

    @property
    def recording(self) -> bool: ...

    def set_attributes(self, attributes: Attributes) -> None: ...


#: the span of the model call whose model computes now (``model_stream``)
_MODEL_CALL: contextvars.ContextVar[_Noted | None] = contextvars.ContextVar(
    "zett_agent_model_call", default=None
)


@contextmanager
def noting(target: _Noted) -> Iterator[None]:
    """Make ``target`` (a model call's span) what ``note_model_call`` writes to in the block."""
    token = _MODEL_CALL.set(target)
    try:
        yield
    finally:
        _MODEL_CALL.reset(token)


class ModelNotes:
    """What a model notes while no span of its call is here: a child's call the parent brokers.

    ``collect()`` makes it the target of ``note_model_call`` for the rest of the current task;
    the broker sends ``attributes`` with the response, and the child's stand-in notes them on
    its own span of the call. Bounded (``clean_attributes``).
    """

    __slots__ = ("attributes",)

    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}

    @property
    def recording(self) -> bool:
        return True

    def set_attributes(self, attributes: Attributes) -> None:
        self.attributes = clean_attributes({**self.attributes, **clean_attributes(attributes)})

    def collect(self) -> None:
        """Take what ``note_model_call`` says in this task (its own context) from now on."""
        _MODEL_CALL.set(self)


def note_model_call(attributes: Attributes) -> None:
    """Put ``attributes`` on the span of the model call running now; nothing when untraced.

    For a model adapter, from inside its ``stream()``: what only the response says
    (``gen_ai.response.id``, ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``).
    They pass the span's gate (``clean_attributes``) like every attribute. Costs a context
    variable look-up when nothing is traced; never raises.
    """
    span = _MODEL_CALL.get()
    if span is None:
        return
    try:
        if span.recording:
            span.set_attributes(attributes)
    except Exception:
        _warn_once("note", "attributes of a model call could not be set on its span")
