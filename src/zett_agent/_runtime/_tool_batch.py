"""The tool calls of one turn: run concurrently, interrupted by steering, answered in order.

``ToolBatch`` runs every call of an assistant message as a task of its own, each through its
hooks (``before_tool``, the ``on_tool_call`` chain of the extensions that override it, then
``after_tool``; traced as an ``execute_tool`` span when the request is traced). A steering
message stops the batch: calls still running are cancelled and calls not run yet are not
started; both are answered as skipped. The tool messages are appended in the order of the
calls, whatever order they finished in. ``answer_dangling_calls`` answers, as skipped, the
calls a request that ends mid-turn left without a result.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from zett_agent._events import ToolCalledEvent, ToolFinishedEvent
from zett_agent._messages import (
    ToolCall,
    ToolMessage,
    ToolStatus,
    skip_unanswered_calls,
)
from zett_agent._tool_args import ToolArgumentError
from zett_agent._tools import (
    AgentTool,
    ToolContext,
    ToolResult,
    UnknownToolError,
    enter_tool_call,
)
from zett_agent._tracing import _tracer as _tracing

if TYPE_CHECKING:
    from zett_agent._runtime._context import AgentRunContext, RunState
    from zett_agent._runtime._extension import Extension
    from zett_agent._runtime._hooks import Hooks

__all__ = [
    "CANCEL_SKIP_TEXT",
    "FAILURE_SKIP_TEXT",
    "STEERING_SKIP_TEXT",
    "ToolBatch",
    "answer_dangling_calls",
]

STEERING_SKIP_TEXT = "skipped: interrupted by a steering message"
CANCEL_SKIP_TEXT = "skipped: the request was cancelled"
FAILURE_SKIP_TEXT = "skipped: the request failed before this call finished"


class ToolBatch:
    """Runs the tool calls of a turn for an agent: ``await tool_batch(run, context, calls)``.

    ``wrappers`` are the extensions that override ``on_tool_call``, in registration order.
    """

    __slots__ = ("_hooks", "_wrappers")

    def __init__(self, wrappers: tuple[Extension, ...], hooks: Hooks) -> None:
        self._wrappers = wrappers
        self._hooks = hooks

    async def __call__(
        self, run: RunState, context: AgentRunContext, calls: Sequence[ToolCall]
    ) -> None:
        """Run ``calls`` and append one tool message per call, in their order.

        Raises:
            Exception: whatever a hook raised in a call (the other calls are cancelled), or
                a tool's ``MemoryError``.

        Cancellation: cancels the calls still running, keeps the results of those that
        completed (appended without events) and propagates.
        """
        results: list[ToolMessage | None] = [None] * len(calls)
        tasks: list[asyncio.Task[ToolMessage]] = []
        if not run.steering:
            loop = asyncio.get_running_loop()
            call_one = self._run_call if run.tracer is None else self._traced_call
            tasks = [loop.create_task(call_one(run, context, call)) for call in calls]
            steered = loop.create_task(run.steered.wait())
            try:
                remaining: set[asyncio.Future[Any]] = set(tasks)
                while remaining:
                    done, _ = await asyncio.wait(
                        remaining | {steered}, return_when=asyncio.FIRST_COMPLETED
                    )
                    remaining -= done
                    if steered in done or any(
                        t is not steered and t.exception() is not None for t in done
                    ):
                        break
            except asyncio.CancelledError:
                await _stop_tasks([*tasks, steered])
                _record_settled(run, tasks)
                raise
            await _stop_tasks([*tasks, steered])
            errors = [t.exception() for t in tasks if not t.cancelled() and t.exception()]
            if errors:
                raise errors[0]  # type: ignore[misc]
            for index, task in enumerate(tasks):
                if not task.cancelled():
                    results[index] = task.result()
        hooks = self._hooks
        for index, call in enumerate(calls):
            message = results[index]
            if message is None:
                message = ToolMessage(call.id, call.name, STEERING_SKIP_TEXT, ToolStatus.SKIPPED)
                await hooks.publish(
                    run, context, ToolFinishedEvent(context.session_id, call, message)
                )
            await hooks.append(run, context, message)

    def _chain(
        self, run: RunState, context: AgentRunContext, tool: AgentTool, index: int
    ) -> Callable[[ToolCall], Awaitable[ToolResult]]:
        if index == len(self._wrappers):
            tools = run.tools

            async def invoke(call: ToolCall) -> ToolResult:
                target = tools.get(call.name, tool)
                return await target.invoke(call.arguments)

            return invoke
        wrapper = self._wrappers[index]
        inner = self._chain(run, context, tool, index + 1)

        async def call_next(call: ToolCall) -> ToolResult:
            result = await wrapper.on_tool_call(context, call, inner)
            return result if isinstance(result, ToolResult) else ToolResult(result)

        return call_next

    async def _traced_call(
        self, run: RunState, context: AgentRunContext, call: ToolCall
    ) -> ToolMessage:
        assert run.tracer is not None
        return await _tracing.tool_call(
            run.tracer, context, call, functools.partial(self._run_call, run)
        )

    async def _run_call(
        self, run: RunState, context: AgentRunContext, call: ToolCall
    ) -> ToolMessage:
        hooks = self._hooks
        # what tool_context() returns in this call's task (a durable child's hook gives the
        # call its stable key in its own before_tool)
        enter_tool_call(ToolContext(call, context.session_id, os.urandom(16).hex()))
        await hooks.call(run, context, "before_tool", call)
        await hooks.publish(run, context, ToolCalledEvent(context.session_id, call))
        tool = run.tools.get(call.name)
        error: BaseException | None = None
        if tool is None:
            error = UnknownToolError(call.name, list(run.tools))
            result = ToolResult.error(str(error))
        else:
            try:
                result = await self._chain(run, context, tool, 0)(call)
            except ToolArgumentError as exc:
                error, result = exc, ToolResult.error(str(exc))
            except MemoryError:
                # Out of memory is the process's state, not the tool's answer: the request
                # fails, so a child agent under a memory limit reports the limit it hit.
                raise
            except Exception as exc:
                error = exc
                result = ToolResult.error(f"{tool.name} failed: {type(exc).__name__}: {exc}")
        # after_tool may edit the result in place (the seed's contract); it edits a copy, so a
        # handler that returns one shared ToolResult object keeps it unchanged for later calls
        result = ToolResult(result.content, result.is_error)
        for ext in hooks.extensions:
            replaced = await ext.after_tool(context, call, result, error)
            if isinstance(replaced, ToolResult):
                result = replaced
            await hooks.flush(run, context)
        status = ToolStatus.FAILED if result.is_error else ToolStatus.OK
        message = ToolMessage(call.id, call.name, result.text, status)
        await hooks.publish(run, context, ToolFinishedEvent(context.session_id, call, message))
        return message


async def _stop_tasks(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


def _record_settled(run: RunState, tasks: Sequence[asyncio.Task[ToolMessage]]) -> None:
    """Keep the results of calls that completed before the batch was cancelled."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is None:
            run.session.messages.append(task.result())


def answer_dangling_calls(run: RunState, text: str) -> None:
    """Answer every unanswered call of the last assistant message as skipped.

    A request that ends in the middle of a turn would otherwise leave tool calls without
    results, which providers reject on the session's next request.
    """
    skip_unanswered_calls(run.session.messages, text)
