"""One request's course: its hooks in their documented order, then turn after turn.

``Turns.execute`` runs a request that holds its session: ``RunStartedEvent``, the agent's
tools, ``on_tool``, ``on_state``, ``on_message``, the input appended, ``before_run``, the
turns, ``after_run``, ``on_success`` and ``RunCompletedEvent`` (or the calls left unanswered
answered as skipped, ``on_error`` and ``RunFailedEvent``, or ``RunCancelledEvent``). A turn
is ``before_turn``, the model request assembled (again when ``before_model`` changed what it
is made of), the model call, its message appended, ``after_model``, the tool batch, the
steering messages that arrived appended, and ``after_turn``; turns go on until the model
answers without tool calls and nothing steered. A request without input (a continuation,
``continue_request``) appends none and skips ``on_message``; it first runs the calls of the
session's last assistant message that have no result. ``Turns.compact`` is the course of
``Agent.compact``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from zett_agent._events import (
    RunCancelledEvent,
    RunCompletedEvent,
    RunFailedEvent,
    RunStartedEvent,
    TurnFinishedEvent,
    TurnStartedEvent,
)
from zett_agent._messages import AssistantMessage, ToolMessage
from zett_agent._model import ModelRequest
from zett_agent._runtime._errors import MaxTurnsExceeded
from zett_agent._runtime._tool_batch import (
    CANCEL_SKIP_TEXT,
    FAILURE_SKIP_TEXT,
    answer_dangling_calls,
)

if TYPE_CHECKING:
    from zett_agent._messages import ToolCall
    from zett_agent._runtime._context import AgentRunContext, RunState
    from zett_agent._runtime._hooks import Hooks
    from zett_agent._runtime._model_call import ModelCall
    from zett_agent._runtime._tool_batch import ToolBatch
    from zett_agent._tools import AgentTool

__all__ = ["Turns"]


class Turns:
    """How an agent runs a request: its hooks, its model calls and its tool batches."""

    __slots__ = ("_hooks", "_model_call", "_tool_batch", "_tools")

    def __init__(
        self,
        hooks: Hooks,
        model_call: ModelCall,
        tool_batch: ToolBatch,
        tools: tuple[AgentTool, ...],
    ) -> None:
        self._hooks = hooks
        self._model_call = model_call
        self._tool_batch = tool_batch
        self._tools = tools

    async def execute(self, run: RunState, context: AgentRunContext) -> AssistantMessage:
        """Run the request of ``context`` and return its final assistant message.

        Raises:
            MaxTurnsExceeded: no final answer within ``config.max_turns`` turns.
            Exception: whatever the model or a hook raised, after the ``on_error`` hooks ran
                and ``RunFailedEvent`` was published.

        Cancellation: answers the turn's unanswered calls as skipped, publishes
        ``RunCancelledEvent`` and propagates.
        """
        hooks = self._hooks
        sid = context.session_id
        try:
            await hooks.publish(run, context, RunStartedEvent(sid))
            await self.register_agent_tools(run, context)
            await hooks.call(run, context, "on_tool")
            await hooks.call(run, context, "on_state")
            continuing = context.input_message is None
            if not continuing:
                await hooks.call(run, context, "on_message")
                assert context.input_message is not None
                await hooks.append(run, context, context.input_message)
            await hooks.call(run, context, "before_run")
            if continuing:
                await self._unanswered(run, context)
            final = await self._turns(run, context)
            await hooks.call(run, context, "after_run", final)
            await hooks.call(run, context, "on_success", final)
            await hooks.publish(run, context, RunCompletedEvent(sid, final))
            return final
        except asyncio.CancelledError:
            answer_dangling_calls(run, CANCEL_SKIP_TEXT)
            await hooks.publish_quietly(run, context, RunCancelledEvent(sid))
            raise
        except Exception as error:
            answer_dangling_calls(run, FAILURE_SKIP_TEXT)
            await hooks.on_error(run, context, error)
            await hooks.publish_quietly(
                run, context, RunFailedEvent(sid, f"{type(error).__name__}: {error}")
            )
            raise

    async def compact(self, run: RunState, context: AgentRunContext) -> None:
        """Restore the session through ``on_tool`` and ``on_state``, then run ``on_compact``.

        Raises:
            Exception: whatever a hook raised, after the ``on_error`` hooks ran.
        """
        hooks = self._hooks
        try:
            await self.register_agent_tools(run, context)
            await hooks.call(run, context, "on_tool")
            await hooks.call(run, context, "on_state")
            await hooks.call(run, context, "on_compact")
        except Exception as error:
            await hooks.on_error(run, context, error)
            raise

    async def register_agent_tools(self, run: RunState, context: AgentRunContext) -> None:
        """Register the agent-level tools for the request (before any ``on_tool`` hook).

        Raises:
            ValueError: two of them share a name.
        """
        run.owner = "the agent's tools"
        try:
            for agent_tool in self._tools:
                context.register_tool(agent_tool)
        finally:
            run.owner = "the agent"

    async def _unanswered(self, run: RunState, context: AgentRunContext) -> None:
        """Finish the turn a dead process left: run the last message's calls without a result.

        Then the steering that arrived, and that turn's ``after_turn``. Nothing when every
        call of the session's last assistant message has its result.
        """
        messages = run.session.messages
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if isinstance(message, AssistantMessage):
                answered = {m.call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
                pending: list[ToolCall] = [c for c in message.tool_calls if c.id not in answered]
                break
        else:
            return
        if not pending:
            return
        hooks = self._hooks
        await self._tool_batch(run, context, pending)
        for user_message in run.take_steering():
            await hooks.append(run, context, user_message)
        await hooks.call(run, context, "after_turn", message)

    @staticmethod
    def _assemble(run: RunState, context: AgentRunContext) -> ModelRequest:
        return ModelRequest(
            messages=context.messages,
            tools=tuple(t.spec for t in run.tools.values()),
            system_prompt=context.system_prompt,
            metadata=context.config.metadata,
        )

    async def _turns(self, run: RunState, context: AgentRunContext) -> AssistantMessage:
        hooks = self._hooks
        config = context.config
        while True:
            if context.turn >= config.max_turns:
                raise MaxTurnsExceeded(
                    f"no final answer after max_turns={config.max_turns} turns in session "
                    f"{context.session_id!r}; raise AgentRunConfig.max_turns or make the model "
                    "answer without tool calls"
                )
            context.turn += 1
            await hooks.publish(run, context, TurnStartedEvent(context.session_id, context.turn))
            await hooks.call(run, context, "before_turn")
            request = self._assemble(run, context)
            version = run.version
            await hooks.call(run, context, "before_model", request)
            if run.version != version:
                request = self._assemble(run, context)
            response = await self._model_call(run, context, request)
            if response.usage is not None:
                context.usage = context.usage + response.usage
            message = response.message
            await hooks.append(run, context, message)
            await hooks.call(run, context, "after_model", response)
            if message.tool_calls:
                await self._tool_batch(run, context, message.tool_calls)
            steered = run.take_steering()
            for user_message in steered:
                await hooks.append(run, context, user_message)
            await hooks.call(run, context, "after_turn", message)
            await hooks.publish(
                run, context, TurnFinishedEvent(context.session_id, context.turn, response.usage)
            )
            if not message.tool_calls and not steered:
                return message
