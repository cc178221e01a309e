"""The child's side of tracing: spans recorded as plain data and sent to the parent.

A traced child has no exporter, no endpoint and no credentials (it may have no network at
all, under a sandbox). Its runtime traces through a ``Recorder`` instead: each span start and
each span end is one event on the child's channel to the parent, through the runner's
``emit`` (the process pool's frames, a Ray task's stream, an in-process queue), so it is
bounded and carried like every other event. The parent re-creates the spans under the child's
``invoke_agent`` span with its own tracer (``zett_agent.runners._span_relay``).

Events (JSON)::

    {"kind": "span_start", "id": 3, "parent": 1, "name": "execute_tool grep",
     "time": <ns since the epoch>, "attributes": {...}}
    {"kind": "span_end", "id": 3, "time": <ns>, "attributes": {...},
     "error": "one line" | null, "error_type": "ValueError" | null}

``id`` numbers the child's spans from 1; ``parent`` is ``null`` for a child of the
``invoke_agent`` span. A start is sent as the span starts, so a child killed in the middle of
a span still leaves the parent a span to close. Attributes pass ``clean_attributes``
(``zett_agent._tracing._base``): strings cut to ``MAX_TEXT`` characters, booleans, ints
clamped to 64 bits, finite floats (or short lists of one of them), at most ``MAX_ATTRIBUTES``
per event; at most ``MAX_CHILD_SPANS`` spans are sent. ``emit`` failing
(the parent gone) stops the recording, never the child's work.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from zett_agent._tracing._base import (
    MAX_ATTRIBUTES,
    MAX_CHILD_SPANS,
    MAX_DESCRIPTION,
    MAX_LIST,
    MAX_TEXT,
    Attributes,
    Kind,
    clean_attributes,
    text,
)

if TYPE_CHECKING:
    from zett_agent._tracing._base import Span

__all__ = ["MAX_ATTRIBUTES", "MAX_LIST", "Recorder", "clean_attributes"]

log = logging.getLogger("zett_agent.tracing")

#: (recorder, local id) of the current span; the recorder is compared, so a nested child's
#: recorder (an in-process grandchild inherits this variable) never takes another one's ids
_CURRENT: contextvars.ContextVar[tuple[Recorder, int] | None] = contextvars.ContextVar(
    "zett_agent_recorded_span", default=None
)


class _RecordedSpan:
    """A span of the child: its id, the attributes set before its end."""

    __slots__ = ("_ended", "_pending", "local_id", "recorder")

    def __init__(self, recorder: Recorder, local_id: int) -> None:
        #: the recorder that numbered this span (and sends its end)
        self.recorder = recorder
        self.local_id = local_id
        self._pending: dict[str, Any] = {}
        self._ended = False

    @property
    def recording(self) -> bool:
        return not self._ended

    def set_attributes(self, attributes: Attributes) -> None:
        if not self._ended:
            self._pending.update(clean_attributes(attributes))

    def end(
        self,
        *,
        error: str | None = None,
        error_type: str | None = None,
        end_ns: int | None = None,
    ) -> None:
        if self._ended:
            return
        self._ended = True
        self.recorder.send(
            {
                "kind": "span_end",
                "id": self.local_id,
                "time": end_ns if end_ns is not None else time.time_ns(),
                "attributes": clean_attributes(self._pending),
                "error": None if error is None else text(error, MAX_DESCRIPTION),
                "error_type": None if error_type is None else text(error_type, 128),
            }
        )

    @contextmanager
    def activate(self) -> Iterator[object]:
        token = _CURRENT.set((self.recorder, self.local_id))
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def traceparent(self) -> str | None:
        return self.recorder.traceparent


class _Unrecorded:
    """What a span beyond the recorder's bound (or after a failed send) is: nothing."""

    __slots__ = ("_traceparent",)

    def __init__(self, traceparent: str) -> None:
        self._traceparent = traceparent

    @property
    def recording(self) -> bool:
        return False

    def set_attributes(self, attributes: Attributes) -> None:
        pass

    def end(self, **_: object) -> None:
        pass

    @contextmanager
    def activate(self) -> Iterator[object]:
        yield self

    def traceparent(self) -> str | None:
        return self._traceparent


class Recorder:
    """The tracer of a traced child: sends each span's start and end through ``emit``.

    ``traceparent`` is the parent's ``invoke_agent`` span of this child: the only span id the
    child knows (its own spans get their ids in the parent), so every span here answers it as
    its ``traceparent()``.
    """

    request_spans = False

    def __init__(self, emit: Callable[[Any], None], traceparent: str) -> None:
        self._emit = emit
        self.traceparent = traceparent
        self._count = 0
        self._broken = False

    def start(
        self,
        name: str,
        attributes: Attributes,
        *,
        parent: Span | None = None,
        start_ns: int | None = None,
        kind: Kind = "internal",
    ) -> Span:
        if self._broken or self._count >= MAX_CHILD_SPANS:
            return _Unrecorded(self.traceparent)
        self._count += 1
        local_id = self._count
        if isinstance(parent, _RecordedSpan) and parent.recorder is self:
            parent_id: int | None = parent.local_id
        else:
            here = _CURRENT.get()
            parent_id = here[1] if here is not None and here[0] is self else None
        self.send(
            {
                "kind": "span_start",
                "id": local_id,
                "parent": parent_id,
                "name": text(name, MAX_TEXT),
                "time": start_ns if start_ns is not None else time.time_ns(),
                "attributes": clean_attributes(dict(attributes)),
            }
        )
        return _RecordedSpan(self, local_id)

    def send(self, event: dict[str, Any]) -> None:
        """Emit one span event; after ``emit`` failed once, nothing more is sent."""
        if self._broken:
            return
        try:
            self._emit(event)
        except Exception:
            # the channel is gone or refuses (the parent went away): the child's work goes on
            self._broken = True
            log.debug("a span event could not be sent; recording stops", exc_info=True)
