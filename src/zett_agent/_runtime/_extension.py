"""The ``Extension`` base class: every hook of the runtime, each a no-op by default."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from zett_agent._events import AgentEvent
from zett_agent._messages import AssistantMessage, ToolCall
from zett_agent._model import ModelEvent, ModelRequest, ModelResponse
from zett_agent._tools import ToolResult

if TYPE_CHECKING:
    from zett_agent._runtime._agent import Agent
    from zett_agent._runtime._context import AgentRunConfig, AgentRunContext

__all__ = [
    "Extension",
    "ModelCallNext",
    "ToolCallNext",
    "closing_stream",
    "request_ended",
    "request_started",
]

ModelCallNext: TypeAlias = Callable[[ModelRequest], AsyncIterator[ModelEvent]]
"""The next layer of the model-request chain: call it with a request, iterate its events."""

ToolCallNext: TypeAlias = Callable[[ToolCall], Awaitable[ToolResult]]
"""The next layer of the tool-call chain: call it with a (possibly changed) call."""

_T = TypeVar("_T")

# Requests in flight per extension instance, keyed by id() so the count never travels with an
# extension that is pickled into a child process and works for unhashable subclasses. An entry
# exists only while the count is positive, and the agents running those requests keep the
# instance alive, so an id is never reused while it has an entry.
_PENDING: dict[int, int] = {}


def request_started(extensions: Iterable[Extension]) -> None:
    """Count one more request in flight for each of ``extensions`` (what ``pending`` reports).

    The agent calls it as a request (or a ``compact``) takes its session, and
    ``request_ended`` as it lets the session go, whatever the request's outcome.
    """
    for ext in extensions:
        _PENDING[id(ext)] = _PENDING.get(id(ext), 0) + 1


def request_ended(extensions: Iterable[Extension]) -> None:
    """Count one request less in flight for each of ``extensions``."""
    for ext in extensions:
        count = _PENDING.pop(id(ext), 0) - 1
        if count > 0:
            _PENDING[id(ext)] = count


@asynccontextmanager
async def closing_stream(stream: AsyncIterator[_T]) -> AsyncIterator[AsyncIterator[_T]]:
    """Like ``contextlib.aclosing`` for any async iterator: ``aclose()`` it on exit if it can.

    Closing the inner stream is what lets cancellation (or an early ``break``) reach the
    provider's generator and its connection.
    """
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


class Extension:
    """Base class of agent extensions; override only the hooks you need.

    The runtime calls each hook on every registered extension, in registration order, at the
    moment its docstring names. An exception raised by a hook fails the request (it goes
    through ``on_error`` to the caller), except where a hook says otherwise.

    One instance may be registered with several agents; per-request data belongs on the
    ``AgentRunContext`` (``context.session_state(self.name)`` persists per session), not on the
    extension.
    """

    # --- identity and lifecycle ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """Unique registration identity, defaulting to the concrete class name.

        Override with a class attribute or assign an instance name to register independently
        configured instances of the same extension type.
        """
        assigned: str | None = self.__dict__.get("_Extension__name")
        return assigned if assigned is not None else type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        self.__name = value  # name-mangled: a subclass's own attributes never meet it

    @property
    def pending(self) -> bool:
        """Whether this extension takes part in an active request.

        The agent updates this for every registered extension, including ones whose hooks are
        idle. One instance shared by several agents and sessions stays pending until every
        request using it has finished, failed or been cancelled. Data kept between requests
        does not count.
        """
        return _PENDING.get(id(self), 0) > 0

    async def on_agent_closed(self, agent: Agent, session_ids: frozenset[str]) -> None:
        """``agent`` was closed; it ran requests of ``session_ids``.

        ``Agent.close()`` calls it on each of its extensions once its background requests
        ended, so an extension can release what it keeps for those sessions (an extension may
        be shared by several agents: a session another open agent also ran is still in use).
        Errors are logged, never raised into ``close()``. The default does nothing.
        """

    def accept(self, config: AgentRunConfig | None, event: Any) -> bool:
        """Handle one external event and report whether it was accepted.

        The agent broadcasts each event to every registered extension (``Agent.accept``).
        Override this synchronous hook when an extension waits for input from another
        thread, an HTTP request or a UI. ``config`` may be ``None``. Return True to be named in
        the broadcast result; returning False does not stop later receivers. The default
        ignores the event.
        """
        return False

    # --- request start ------------------------------------------------------------------------

    async def on_tool(self, context: AgentRunContext) -> None:
        """Register this request's tools with ``context.register_tool``.

        Runs first at every request start and at ``compact``.
        """

    async def on_state(self, context: AgentRunContext) -> None:
        """Restore state; runs after every ``on_tool`` at request start and at ``compact``."""

    async def on_message(self, context: AgentRunContext) -> None:
        """Transform ``context.input_message`` after state restoration, before it is appended.

        Replace the pending message to implement externally selected modes. Do not append
        it here: the runtime appends the final message exactly once after all ``on_message``
        hooks, then publishes ``MessageAppendedEvent``.
        """

    async def before_run(self, context: AgentRunContext) -> None:
        """Run after the transformed input is appended and published."""

    # --- turns and model calls ----------------------------------------------------------------

    async def before_turn(self, context: AgentRunContext) -> None:
        """Run before this turn's model call.

        Runs after ``before_run`` on the first turn and after the previous turn's
        ``after_turn`` on later ones. Request assembly and ``before_model`` follow, so context
        edited here (messages, system prompt, tools) reaches the provider.
        """

    async def before_model(self, context: AgentRunContext, request: ModelRequest) -> None:
        """Run before each model call with the assembled request.

        Messages added to the context here (``context.add_message``) still reach this call:
        the runtime reassembles the request when the context changed.
        """

    async def on_model_request(
        self, context: AgentRunContext, request: ModelRequest, call_next: ModelCallNext
    ) -> AsyncIterator[ModelEvent]:
        """Wrap one provider request and its whole streamed response (an async generator).

        Pass ``request`` (or a ``dataclasses.replace`` of it) to ``call_next`` and yield the
        events on. The first registered extension is the outermost layer. The default closes
        the inner stream on exit so cancellation reaches the provider; do the same with
        ``closing_stream`` (or ``contextlib.aclosing``) when overriding. The runtime retries
        the whole chain on a retryable ``ModelError`` raised before the completed event.
        """
        async with closing_stream(call_next(request)) as stream:
            async for event in stream:
                yield event

    async def after_model(self, context: AgentRunContext, response: ModelResponse) -> None:
        """Run after the complete assistant message is appended."""

    # --- tools --------------------------------------------------------------------------------

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        """Run before one requested tool is invoked (also for unknown tool names)."""

    async def on_tool_call(
        self, context: AgentRunContext, call: ToolCall, call_next: ToolCallNext
    ) -> ToolResult:
        """Wrap one registered local tool handler and return its ``ToolResult``.

        An extension may call ``call_next`` with changed arguments
        (``dataclasses.replace(call, arguments=...)``), return its own result without calling
        the next layer, transform the result, or raise: an exception becomes a failed
        ``ToolMessage`` like a handler's exception. The first registered extension is the
        outermost layer. Not called for unknown tool names.
        """
        return await call_next(call)

    async def after_tool(
        self,
        context: AgentRunContext,
        call: ToolCall,
        result: ToolResult,
        error: BaseException | None,
    ) -> ToolResult | None:
        """Inspect or modify a tool result before it is appended.

        ``error`` is the original exception of a failed call (argument errors and unknown
        tools included) and ``None`` after a successful one. Changes made to ``result`` in
        place (``result.content = ...``, ``result.is_error = ...``) are included in context,
        persistence and the next model request; returning a ``ToolResult`` replaces it instead
        (later extensions see the replacement); returning ``None`` keeps it. Raising fails the
        request; the result is not appended. Not called for calls skipped by steering.
        """
        return None

    async def after_turn(self, context: AgentRunContext, result: AssistantMessage) -> None:
        """Run once the turn's assistant message and every tool result are settled.

        ``result`` is the assistant message that opened the turn: the final answer or the
        tool-calling message. Failed calls and calls skipped by steering have their
        ``ToolMessage`` appended already, and so does the steering ``UserMessage``; the
        steering turn follows as the next turn. A turn that never completed (the request
        failed or was cancelled) has no ``after_turn``.
        """

    # --- request end --------------------------------------------------------------------------

    async def after_run(self, context: AgentRunContext, result: AssistantMessage) -> None:
        """Run after a successful final answer is appended."""

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        """Run once after every ``after_run`` succeeded, before ``RUN_COMPLETED`` is published.

        Failed or cancelled requests do not call it. Its errors go through ``on_error`` to the
        caller and prevent ``RUN_COMPLETED``.
        """

    async def on_error(self, context: AgentRunContext, error: BaseException) -> None:
        """Run before an agent error propagates to the caller.

        Errors raised here are logged and do not replace the original error. Not called for
        cancellation (watch for ``RunCancelledEvent``).
        """

    async def on_event(self, context: AgentRunContext, event: AgentEvent) -> None:
        """Process one published notification; inspect its type with ``match``."""

    async def on_compact(self, context: AgentRunContext) -> None:
        """Summarize restored context when a caller asks for compaction.

        ``Agent.compact`` restores the session through ``on_tool`` and ``on_state``, appends no
        input and makes no model call; the only work is what this hook does.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} pending={self.pending}>"
