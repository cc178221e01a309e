"""What a span of the runtime may carry: the names it uses, and the one gate every value passes.

The names are those of the OpenTelemetry GenAI semantic conventions (a test checks each against
the ``opentelemetry-semantic-conventions`` package), plus two of the runtime's own
(``zett_agent.*``). ``clean_attributes`` is the gate: every attribute that enters a span of the
runtime passes it, whether it is set when the span starts, set later, or summed from a child's
records, in the OpenTelemetry tracer (``zett_agent._tracing._otel``), a child's recorder
(``zett_agent._tracing._span_record``) and the parent's relay of a child's records
(``zett_agent.runners._span_relay``) alike. What comes out of it any exporter can encode: ints
within 64 bits (clamped), bools as bools, finite floats, bounded valid text, short lists of one
of these.

Also the rest of the vocabulary every part of tracing shares: what a span and a tracer are to
the runtime (``Span``, ``Tracer``), what a traced request shows of itself (``Traced``), an
error as a span's status says it (``describe``, ``error_type``), and this process as a child
compares it with its own (``origin``).

Light (imported by every agent, children included): it imports nothing but ``_text``.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

from zett_agent._text import valid_text

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "MAX_ATTRIBUTES",
    "MAX_CHILD_SPANS",
    "MAX_DESCRIPTION",
    "MAX_LIST",
    "MAX_TEXT",
    "AttributeValue",
    "Attributes",
    "Kind",
    "Span",
    "Traced",
    "Tracer",
    "add_ints",
    "clamp_int",
    "clean_attributes",
    "describe",
    "error_type",
    "origin",
    "text",
]

# -- names: the GenAI semantic conventions ------------------------------------------------------

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
CONVERSATION = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
AGENT_DESCRIPTION = "gen_ai.agent.description"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

#: the operations (``gen_ai.operation.name``), each the first word of its spans' names
CHAT = "chat"
INVOKE_AGENT = "invoke_agent"
EXECUTE_TOOL = "execute_tool"

#: ``gen_ai.provider.name`` of the OpenAI adapter (a value the conventions list)
PROVIDER_OPENAI = "openai"
#: ``gen_ai.provider.name`` of the Anthropic adapter (a value the conventions list)
PROVIDER_ANTHROPIC = "anthropic"
#: ``gen_ai.provider.name`` of a model that names no provider (the offline ``ScriptedModel`` and
#: ``FunctionModel``, an application's own model class): the runtime's own name, a custom value
PROVIDER_UNKNOWN = "zett_agent"

# -- names: the runtime's own ------------------------------------------------------------------

#: what the parent's model wrote as the task's description (``task_start``'s ``description``)
TASK_DESCRIPTION = "zett_agent.task.description"
#: span records of a child that did not fit and were dropped
SPANS_DROPPED = "zett_agent.spans_dropped"
#: an ``Egress`` child's connections its parent's proxy allowed and denied, and the bytes moved
EGRESS_ALLOWED = "zett_agent.egress.allowed"
EGRESS_DENIED = "zett_agent.egress.denied"
EGRESS_BYTES = "zett_agent.egress.bytes"

# -- bounds ------------------------------------------------------------------------------------

#: longest text the runtime puts into a span name, an attribute or a status description
MAX_TEXT = 256
#: attributes taken from one mapping, and items kept of one list value
MAX_ATTRIBUTES = 32
MAX_LIST = 16
#: the range of an int attribute (OTLP carries a signed 64-bit int)
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1


def text(value: object, limit: int = MAX_TEXT) -> str:
    """``value`` as valid Unicode of at most ``limit`` characters (for names and attributes).

    Always a ``str`` itself, never a subclass (its methods are not called).
    """
    if type(value) is not str:
        value = str.__str__(value) if isinstance(value, str) else str(value)
    return valid_text(value if len(value) <= limit else value[: limit - 3] + "...")


def clamp_int(value: int) -> int:
    """``value`` clamped into the 64-bit range an exporter can encode (a plain ``int``)."""
    return INT_MIN if value < INT_MIN else INT_MAX if value > INT_MAX else int.__int__(value)


def add_ints(a: int, b: int) -> int:
    """``a + b`` saturated at the 64-bit bounds (a sum of span attributes never overflows)."""
    return clamp_int(a + b)


def _scalar(value: object) -> str | bool | int | float | None:
    if isinstance(value, bool):
        return value is True
    if isinstance(value, int):
        return clamp_int(value)
    if isinstance(value, float):
        return float.__float__(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return text(value)
    return None


def clean_attributes(attributes: object) -> dict[str, Any]:
    """Return the attributes of ``attributes`` (any object) that a span may carry.

    Within bounds: at most ``MAX_ATTRIBUTES`` string keys of at most ``MAX_TEXT`` characters,
    each with a string (cut to ``MAX_TEXT`` characters, valid Unicode), a boolean, an int
    (clamped to ``[INT_MIN, INT_MAX]``), a finite float, or a list of at most ``MAX_LIST``
    values of one of these types (the first item's); only the first ``2 * MAX_ATTRIBUTES``
    items are looked at. Anything else is left out. Values of the builtin types only (a
    subclass is converted, none of its methods called). Never raises for any JSON data or
    any ``dict``.
    """
    if not isinstance(attributes, Mapping) or not attributes:
        return {}
    out: dict[str, Any] = {}
    # looks at a bounded number of items: a dict of a million bad keys costs what 64 do
    for key, value in itertools.islice(attributes.items(), 2 * MAX_ATTRIBUTES):
        if len(out) >= MAX_ATTRIBUTES:
            break
        if not isinstance(key, str) or not 0 < len(key) <= MAX_TEXT:
            continue
        if isinstance(value, list | tuple):
            items = [_scalar(v) for v in value[:MAX_LIST]]
            if items and items[0] is not None and all(type(i) is type(items[0]) for i in items):
                out[text(key)] = items
            continue
        scalar = _scalar(value)
        if scalar is not None:
            out[text(key)] = scalar
    return out


# -- what a span is -----------------------------------------------------------------------------

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[bool] | Sequence[int]
Attributes = Mapping[str, AttributeValue]
Kind = Literal["internal", "client"]

#: spans one child may record (the parent enforces the same bound on what it receives)
MAX_CHILD_SPANS = 10_000
#: longest status description (an error's one line)
MAX_DESCRIPTION = 500


class Span(Protocol):
    """One span as the runtime holds it, whatever backs it.

    OpenTelemetry, or a child's recorder. No method raises. Every attribute, given to the
    tracer's ``start`` or to ``set_attributes``, passes
    ``zett_agent._tracing._base.clean_attributes`` in the implementation (ints clamped to
    64 bits, text bounded), so no value can fail an exporter.
    """

    @property
    def recording(self) -> bool:
        """Whether what is set on the span is kept (false for a sampled-out span)."""
        ...

    def set_attributes(self, attributes: Attributes) -> None: ...

    def end(
        self,
        *,
        error: str | None = None,
        error_type: str | None = None,
        end_ns: int | None = None,
    ) -> None:
        """End the span (once; later calls are ignored).

        With an error status, ``error`` as its description and ``error.type`` set, when
        ``error`` is given.
        """
        ...

    def activate(self) -> AbstractContextManager[object]:
        """Make this the current span inside the ``with`` block.

        Spans started there without a ``parent`` become its children.
        """
        ...

    def traceparent(self) -> str | None:
        """Return the W3C ``traceparent`` of this span, or ``None`` if there is none.

        Or of its nearest ancestor whose id is known here: a child knows only its
        ``invoke_agent`` span's.
        """
        ...


class Tracer(Protocol):
    """Starts spans.

    ``request_spans`` says whether a request of an agent is a span of its own (false in a
    child: the parent's ``invoke_agent`` span is its request).
    """

    request_spans: bool

    def start(
        self,
        name: str,
        attributes: Attributes,
        *,
        parent: Span | None = None,
        start_ns: int | None = None,
        kind: Kind = "internal",
    ) -> Span:
        """Start a span under ``parent`` (default: the current span). Never raises."""
        ...


class Traced(Protocol):
    """What the spans of a request read of it (an ``AgentRunContext`` is one)."""

    @property
    def model(self) -> object:
        """The model the request runs on (its provider and name go on the request's span)."""
        ...

    @property
    def session_id(self) -> str:
        """The session the request runs in (the span's conversation)."""
        ...

    @property
    def usage(self) -> Any:
        """The tokens the request used so far: ``input_tokens``, ``output_tokens`` (or None)."""
        ...


# -- errors, and this process ---------------------------------------------------------------------


def describe(error: BaseException) -> str:
    """A status description for an exception: one line, bounded."""
    if isinstance(error, GeneratorExit):
        return "the stream was closed before it ended"
    if _is_cancel(error):
        return "cancelled"
    detail = " ".join(str(error).split())
    line = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
    return text(line, MAX_DESCRIPTION)


def error_type(error: BaseException) -> str:
    """The ``error.type`` of an exception: its class name (low cardinality)."""
    return "cancelled" if _is_cancel(error) else text(type(error).__qualname__, 128)


def _is_cancel(error: BaseException) -> bool:
    import asyncio

    return isinstance(error, asyncio.CancelledError)


#: tells a child whether it runs in the process of the parent that traced it (then it must
#: not touch the environment, which it shares with the parent and its siblings)
_PROCESS_TOKEN = os.urandom(8).hex()


def origin() -> list[object]:
    """This process, as a child compares it with its own (``[pid, random token]``)."""
    return [os.getpid(), _PROCESS_TOKEN]
