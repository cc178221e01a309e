"""The parent's side of a child's spans: its ``invoke_agent`` span, and the spans it sent.

The child's spans are re-created under its ``invoke_agent`` span with the parent's tracer.

A child's spans arrive as events (``zett_agent._tracing._span_record`` says their form) among its
progress events. What a child sends is hostile data to the parent: every field is checked for
its exact type, every text is cut, attribute counts are capped, times are clamped into the
child's lifetime as the parent sees it (``invoke_agent`` start .. the moment the event
arrived, which also absorbs another host's clock skew), at most ``MAX_CHILD_SPANS`` spans are
re-created per child, at most ``MAX_OPEN`` held open at once and none deeper than
``MAX_DEPTH`` below the ``invoke_agent`` span, and nothing raises: an event that does not fit
(a span whose parent is not open in the parent process included) is dropped (and counted on
the ``invoke_agent`` span as ``zett_agent.spans_dropped``). Attributes pass
``clean_attributes`` as they arrive and again as the tracer takes them, and the token totals
summed onto the ``invoke_agent`` span saturate at 64 bits: no value a child sends can fail the
export of the batch it lands in.

When the child ends, every span it left open ends with an error status naming why (the
child's own failure reason when it crashed, was killed, timed out or was cancelled), then its
``invoke_agent`` span ends, with the child's outcome as its status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from zett_agent._tracing._base import (
    AGENT_DESCRIPTION,
    AGENT_ID,
    AGENT_NAME,
    CHAT,
    CONVERSATION,
    EGRESS_ALLOWED,
    EGRESS_BYTES,
    EGRESS_DENIED,
    INPUT_TOKENS,
    INVOKE_AGENT,
    MAX_CHILD_SPANS,
    MAX_DESCRIPTION,
    OPERATION,
    OUTPUT_TOKENS,
    SPANS_DROPPED,
    TASK_DESCRIPTION,
    Kind,
    Span,
    Tracer,
    add_ints,
    clean_attributes,
    describe,
    error_type,
    origin,
    text,
)
from zett_agent._tracing._trace_models import agent_attributes
from zett_agent._tracing._tracer import current, warn_once

if TYPE_CHECKING:
    from zett_agent.runners._base import ChildJob
    from zett_agent.runners._child import ChildSpec

__all__ = ["MAX_DEPTH", "MAX_OPEN", "ChildTrace", "child_trace"]

log = logging.getLogger("zett_agent.tracing")

#: spans of one child held open at once in the parent
MAX_OPEN = 256
#: deepest a child's span may sit below its ``invoke_agent`` span (1: a direct child)
MAX_DEPTH = 32
_MAX_ID = 2**53


def _local_id(value: object) -> int | None:
    return value if type(value) is int and 0 < value < _MAX_ID else None


def _clamp(value: object, low: int, high: int) -> int:
    if type(value) is not int:
        return high
    return min(max(value, low), high)


def _line(value: object, limit: int) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return text(" ".join(value.split()), limit)


class ChildTrace:
    """One child's spans in the parent. Made by ``zett_agent._tracing._tracer.child_trace``.

    Use: ``ship(spec)`` before the child starts (it carries the ``traceparent`` of the
    ``invoke_agent`` span to the child), ``fold(event)`` for each event the child emits
    (true when it was a span event, which is then consumed), and ``end_job(job)`` once the
    child's job is done (or ``abandon(error)`` when it never started). No method raises.
    """

    def __init__(
        self,
        tracer: Tracer,
        agent_name: str,
        agent_id: str,
        conversation_id: str,
        description: str = "",
        *,
        agent_description: str = "",
        model: object = None,
    ) -> None:
        self._tracer = tracer
        self._started_ns = time.time_ns()
        name = text(agent_name, 128)
        attributes: dict[str, Any] = {
            OPERATION: INVOKE_AGENT,
            AGENT_NAME: name,
            AGENT_ID: text(agent_id),
            CONVERSATION: text(conversation_id),
        }
        if model is not None:
            attributes.update(agent_attributes(model))
        if agent_description:
            attributes[AGENT_DESCRIPTION] = text(agent_description)
        if description:
            attributes[TASK_DESCRIPTION] = text(description)
        self._root: Span = tracer.start(
            f"{INVOKE_AGENT} {name}", attributes, start_ns=self._started_ns
        )
        #: the child's open spans by its local id, with their start and depth (in insertion
        #: order)
        self._open: dict[int, tuple[Span, int, int]] = {}
        self._seen = 0
        self._dropped = 0
        self._tokens = [0, 0]
        self._closed = False

    @property
    def span(self) -> Span:
        """The child's ``invoke_agent`` span."""
        return self._root

    def ship(self, spec: ChildSpec) -> ChildSpec:
        """Return ``spec`` with what the child needs to trace.

        That is the ``traceparent`` of its span, whether that span records (a sampled-out child
        records nothing), and this process's identity (a child running in this very process leaves
        the environment alone).
        """
        traceparent = self._root.traceparent()
        if traceparent is None:
            return spec
        trace = {"traceparent": traceparent, "record": self._root.recording, "origin": origin()}
        return dataclasses.replace(spec, trace=trace)

    # -- events -------------------------------------------------------------------------------

    def fold(self, event: Any) -> bool:
        """Take ``event`` if it is one of the child's span events; return whether it was."""
        if type(event) is not dict:
            return False
        kind = event.get("kind")
        if kind != "span_start" and kind != "span_end":
            return False
        if self._closed:
            return True
        try:
            if kind == "span_start":
                self._start(event)
            else:
                self._end(event)
        except Exception:  # a bug here must not reach the parent's watcher
            self._dropped += 1
            log.debug("a child's span event was dropped", exc_info=True)
        return True

    def _start(self, event: dict[str, Any]) -> None:
        local = _local_id(event.get("id"))
        if (
            local is None
            or local in self._open
            or self._seen >= MAX_CHILD_SPANS
            or len(self._open) >= MAX_OPEN
        ):
            self._dropped += 1
            return
        self._seen += 1
        parent, depth = self._root, 1
        if event.get("parent") is not None:
            # a parent that is not open here (never sent, ended, dropped) makes the record bad:
            # so the subtree of a dropped span is dropped too, and no chain grows past the bound
            parent_local = _local_id(event.get("parent"))
            opened = self._open.get(parent_local) if parent_local is not None else None
            if opened is None or opened[2] >= MAX_DEPTH:
                self._dropped += 1
                return
            parent, depth = opened[0], opened[2] + 1
        name = _line(event.get("name"), 128) or "span"
        attributes = clean_attributes(event.get("attributes"))
        start = _clamp(event.get("time"), self._started_ns, time.time_ns())
        kind: Kind = "client" if attributes.get(OPERATION) == CHAT else "internal"
        span = self._tracer.start(name, attributes, parent=parent, start_ns=start, kind=kind)
        self._open[local] = (span, start, depth)

    def _end(self, event: dict[str, Any]) -> None:
        local = _local_id(event.get("id"))
        entry = self._open.pop(local, None) if local is not None else None
        if entry is None:
            self._dropped += 1
            return
        span, start, _ = entry
        attributes = clean_attributes(event.get("attributes"))
        if attributes:
            span.set_attributes(attributes)
            for index, key in enumerate((INPUT_TOKENS, OUTPUT_TOKENS)):
                value = attributes.get(key)
                if type(value) is int and value > 0:  # clamped to 64 bits, and so is the sum
                    self._tokens[index] = add_ints(self._tokens[index], value)
        error = _line(event.get("error"), MAX_DESCRIPTION)
        kind = _line(event.get("error_type"), 128)
        end = _clamp(event.get("time"), start, time.time_ns())
        span.end(error=error, error_type=(kind or "_OTHER") if error else None, end_ns=end)

    def follow(self, job: ChildJob) -> asyncio.Task[None]:
        """Fold ``job``'s span events in a task of its own; ``finish`` awaits it.

        For a caller that reads no other event of the child: the foreground
        ``SubAgentExtension``.
        """

        async def read() -> None:
            async for event in job.events():
                self.fold(event)

        return asyncio.get_running_loop().create_task(read(), name="zett-agent-child-spans")

    async def finish(self, job: ChildJob, follower: asyncio.Task[None] | None) -> None:
        """Once ``job`` is done, wait for ``follower`` to fold the last events, then ``end_job``.

        The event stream ends with the job. Never raises, cancellation aside.
        """
        try:
            if follower is not None:
                if not job.done():
                    follower.cancel()
                await asyncio.wait({follower})
                if not follower.cancelled() and follower.exception() is not None:
                    log.debug("reading a child's spans failed", exc_info=follower.exception())
        finally:
            self.end_job(job)  # a caller cancelled meanwhile still leaves closed spans

    # -- the end ------------------------------------------------------------------------------

    def end_job(self, job: ChildJob | None) -> None:
        """End every span still open and the ``invoke_agent`` span, from the job's outcome.

        No status for a child that completed, an error with its one-line reason otherwise.
        """
        if self._closed:
            return
        try:
            reason: str | None = None
            kind: str | None = None
            if job is not None:
                self._egress(job)
            if job is None or not job.done():
                reason = "the task's supervisor stopped before the child finished"
                kind = "interrupted"
            else:
                error = job.exception()
                if error is not None:
                    from zett_agent.runners._report import failure_reason

                    reason = failure_reason(error)
                    kind = _job_error_type(error)
        except Exception:
            log.debug("could not read a child's outcome for its span", exc_info=True)
            reason, kind = "the child's outcome could not be read", "_OTHER"
        self._close(reason, kind)

    def abandon(self, error: BaseException) -> None:
        """End the spans of a child that never started (its start raised ``error``)."""
        self._close(describe(error), error_type(error))

    def _egress(self, job: ChildJob) -> None:
        """An ``Egress`` child's counts on its span (``zett_agent.egress.*``)."""
        egress = job.info().get("egress")
        if isinstance(egress, dict):
            self._root.set_attributes(
                {
                    EGRESS_ALLOWED: egress.get("allowed", 0),
                    EGRESS_DENIED: egress.get("denied", 0),
                    EGRESS_BYTES: egress.get("bytes", 0),
                }
            )

    def _close(self, reason: str | None, kind: str | None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            now = time.time_ns()
            why = "the child ended before this span ended"
            if reason:
                why = text(f"{why}: {reason}", MAX_DESCRIPTION)
            for span, _, _ in reversed(list(self._open.values())):
                span.end(error=why, error_type=kind or "incomplete", end_ns=now)
            self._open.clear()
            attributes: dict[str, Any] = {}
            if any(self._tokens):
                attributes[INPUT_TOKENS], attributes[OUTPUT_TOKENS] = self._tokens
            if self._dropped:
                attributes[SPANS_DROPPED] = self._dropped
            if attributes:
                self._root.set_attributes(attributes)
            self._root.end(error=reason, error_type=kind, end_ns=now)
        except Exception:
            log.debug("could not end a child's spans", exc_info=True)


def child_trace(
    agent_name: str,
    agent_id: str,
    conversation_id: str,
    description: str = "",
    *,
    agent_description: str = "",
    model: object = None,
) -> ChildTrace | None:
    """Open the ``invoke_agent {agent_name}`` span of a child about to start.

    Under the current span (the parent's ``execute_tool task_start``); ``None`` when nothing
    is traced. ``description`` is the task's (what the parent's model wrote),
    ``agent_description`` the definition's, ``model`` the child's model (its provider and name
    go on the span). See ``zett_agent.runners._span_relay.ChildTrace`` for what to do with it.
    """
    tracer = current()
    if tracer is None:
        return None
    try:
        return ChildTrace(
            tracer,
            agent_name,
            agent_id,
            conversation_id,
            description,
            agent_description=agent_description,
            model=model,
        )
    except Exception:
        warn_once("child", "could not open the span of a child agent; it is not traced")
        return None


def _job_error_type(error: BaseException) -> str:
    """Return the ``error.type`` of a child's failure.

    The child's own exception type when it raised, else the engine's error class (``JobTimeout``,
    ``WorkerCrashed``, ``JobCancelled``...).
    """
    from zett_agent.process import JobCancelled, JobFailed

    if isinstance(error, JobFailed):
        return text(error.type_name or "JobFailed", 128)
    if isinstance(error, JobCancelled):
        return "cancelled"
    return text(type(error).__name__, 128)
