"""One MCP client: its extension session, the tools it calls, its MCP tasks, and its leaving.

Every client (the one of a stdio server, each session of an HTTP server) has a session of its
own in the server's ``AsyncSubAgentExtension``: the five task tools, the children's tools and
its MCP tasks all run their children there, so a client sees its own children and nobody
else's. Nothing here imports the ``mcp`` SDK: the server hands a client the way to notify its
connection (``connect``) and turns its answers into the SDK's types.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from zett_agent._mcp._child_tools import ChildTool, ToolAnswer, child_answer
from zett_agent._mcp._progress import forward_progress
from zett_agent._mcp._tasks import McpTask, McpTasks
from zett_agent.tools import AgentTool, ToolArgumentError, UnknownToolError

if TYPE_CHECKING:
    from zett_agent._mcp._progress import Send
    from zett_agent._mcp._watch import Bells
    from zett_agent.agent import AgentRunContext
    from zett_agent.extensions._async_subagent import AsyncSubAgentExtension
    from zett_agent.extensions._tasks._task import SubAgentTask

__all__ = ["CallRefused", "McpClient", "Notify"]

log = logging.getLogger(__name__)

#: sends one notification (method, params) on a client's connection
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]


class CallRefused(Exception):
    """A task-augmented call that starts no task; ``code`` is its JSON-RPC error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Parent:
    """The parent as the extension sees it: the MCP client, open until it leaves."""

    closed = False


class _ToolContext:
    """What the task tools and ``start`` read of their ``AgentRunContext``, and all of it.

    ``session_id``, ``agent`` (recorded as a user of the session; ``closed`` refuses new starts)
    and ``model`` (the parent's model, which a definition with ``model=None`` would get: the
    server refuses those, so it is ``None``). Anything else a tool asks for fails that call
    with an ``AttributeError`` naming it.
    """

    model = None

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.agent = _Parent()


class McpClient:
    """One client of the server.

    Args:
        extension: The extension every child runs in.
        bells: Rung as children report (for progress notifications).
        child_tools: The children's tools, by name (shared by every client).
        session_id: This client's session in the extension.
        max_ttl_ms: The longest lifetime an MCP task gets.
    """

    def __init__(
        self,
        extension: AsyncSubAgentExtension,
        bells: Bells,
        child_tools: Mapping[str, ChildTool],
        session_id: str,
        *,
        max_ttl_ms: int,
    ) -> None:
        self.extension = extension
        self.session_id = session_id
        self._bells = bells
        self._context = _ToolContext(session_id)
        self._run_context = cast("AgentRunContext", self._context)
        built = extension.build_tools(self._run_context, extension.subagents)
        #: the extension's task tools (the five), by name
        self.task_tools: dict[str, AgentTool] = {tool.name: tool for tool in built}
        self.child_tools = child_tools
        self._notify: Notify | None = None
        self.tasks = McpTasks(
            extension,
            bells,
            self.notify,
            max_ttl_ms=max_ttl_ms,
            max_retained=extension.max_retained,
        )
        #: kills of children whose plain call was cancelled, kept until done
        self._kills: set[asyncio.Task[Any]] = set()

    @property
    def left(self) -> bool:
        """The client went away: no child starts for it any more."""
        return self._context.agent.closed

    def connect(self, notify: Notify) -> None:
        """Notify the client through ``notify`` from now on (its connection's channel)."""
        self._notify = notify

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send one notification to the client, best effort: a lost one is only logged."""
        if self._notify is None or self.left:
            return
        try:
            await self._notify(method, params)
        except Exception:
            log.debug("%s not sent to %s", method, self.session_id, exc_info=True)

    # -- calls ------------------------------------------------------------------------------

    async def call(
        self, name: str, arguments: Mapping[str, Any], progress: Send | None
    ) -> ToolAnswer:
        """Run one tool plainly and answer as MCP does; never raises for a bad call.

        ``progress`` (when the call asked for progress) sends the progress of the child the
        call waits for: the child of a child's tool, or the running task ``task_output`` waits
        for (``task_cancel`` until its tree is gone).

        Cancellation: cancelling the call of a child's tool kills its child; cancelling a task
        tool's call stops its wait, never the task (only ``task_cancel`` does, as on the agent
        path).
        """
        child_tool = self.child_tools.get(name)
        if child_tool is not None:
            return await self._call_child(child_tool, arguments, progress)
        tool = self.task_tools.get(name)
        if tool is None:
            return ToolAnswer(str(UnknownToolError(name, self.tool_names())), is_error=True)
        task = self._named_task(arguments) if progress is not None else None
        forwarder = None
        if task is not None and progress is not None:
            forwarder = asyncio.ensure_future(forward_progress(task, self._bells, progress))
        try:
            result = await tool.invoke(arguments)
        except ToolArgumentError as exc:
            return ToolAnswer(str(exc), is_error=True)
        except Exception as exc:  # what the agent path makes of a tool's error, word for word
            return ToolAnswer(f"{tool.name} failed: {type(exc).__name__}: {exc}", is_error=True)
        finally:
            if forwarder is not None:
                await _stop(forwarder)
        text = result.text
        return ToolAnswer(text, structured=_json_object(text), is_error=result.is_error)

    async def start_task(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        ttl: int | None,
        progress_token: str | int | None,
    ) -> McpTask:
        """Start a child's tool as an MCP task and return the task (``working``) at once.

        Raises:
            CallRefused: the tool does not run as a task (-32601, the spec's answer for a tool
                without task support), or its child could not start (-32602, saying why).
        """
        child_tool = self.child_tools.get(name)
        if child_tool is None:
            supported = ", ".join(self.child_tools) or "none"
            what = "is not a tool here" if name not in self.task_tools else "runs plainly only"
            raise CallRefused(
                -32601,
                f"tool {name!r} {what}; call it without 'task', or call one of the tools that "
                f"run as tasks: {supported}",
            )
        child = await self._start_child(child_tool, arguments)
        return self.tasks.create(child, name, ttl=ttl, progress_token=progress_token)

    def tool_names(self) -> list[str]:
        return [*self.task_tools, *self.child_tools]

    # -- leaving ----------------------------------------------------------------------------

    async def leave(self, *, keep_tasks: bool) -> None:
        """The client went away: no child starts for it any more.

        With ``keep_tasks`` (HTTP), the children of its running MCP tasks run on until each
        task's lifetime ends (then they are killed); every other child of its session, which
        nobody can read any more, is killed now, and its finished tasks are forgotten. Once no
        task is left, its extension session is released. Without ``keep_tasks``, the caller
        closes the extension, which kills them all.
        """
        self._context.agent.closed = True
        self._notify = None
        if not keep_tasks:
            await self.tasks.close()
            return
        self.tasks.orphan()
        mcp_children = {task.child for task in self.tasks.tasks()}
        others = [
            child
            for child in self.extension.tasks(self.session_id)
            if not child.done() and child not in mcp_children
        ]
        await asyncio.gather(*(self.extension.cancel(child) for child in others))
        await self.tasks.empty.wait()
        await self.close()

    async def close(self) -> None:
        """Stop the MCP tasks' timers and notifications, release the extension session.

        Releasing it kills its running children (and forgets its records).
        """
        await self.tasks.close()
        await self.extension.on_agent_closed(
            cast("Any", self._context.agent), frozenset({self.session_id})
        )
        for kill in list(self._kills):
            with contextlib.suppress(asyncio.CancelledError):
                await kill

    # -- inside -----------------------------------------------------------------------------

    async def _start_child(self, tool: ChildTool, arguments: Mapping[str, Any]) -> SubAgentTask:
        try:
            return await tool.start(self._run_context, arguments)
        except ToolArgumentError as exc:
            raise CallRefused(-32602, str(exc)) from None
        except (ValueError, TypeError, RuntimeError) as exc:
            raise CallRefused(-32602, f"{tool.name} failed: {type(exc).__name__}: {exc}") from None

    async def _call_child(
        self, tool: ChildTool, arguments: Mapping[str, Any], progress: Send | None
    ) -> ToolAnswer:
        try:
            child = await self._start_child(tool, arguments)
        except CallRefused as exc:
            return ToolAnswer(str(exc), is_error=True)
        forwarder = None
        if progress is not None:
            forwarder = asyncio.ensure_future(forward_progress(child, self._bells, progress))
        try:
            await child.settled.wait()
        except asyncio.CancelledError:
            # the call is the child's whole reason to run: no call, no child
            kill = asyncio.ensure_future(self.extension.cancel(child))
            self._kills.add(kill)
            kill.add_done_callback(self._kills.discard)
            raise
        finally:
            if forwarder is not None:
                await _stop(forwarder)
        return child_answer(self.extension, child)

    def _named_task(self, arguments: Mapping[str, Any]) -> SubAgentTask | None:
        task_id = arguments.get("task_id")
        if not isinstance(task_id, str):
            return None
        try:
            task = self.extension.get_task(self.session_id, task_id)
        except ValueError:
            return None  # the tool itself says what is wrong with it
        return None if task.done() else task


async def _stop(forwarder: asyncio.Future[None]) -> None:
    forwarder.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await forwarder


def _json_object(text: str) -> dict[str, Any] | None:
    """The tool's JSON result as a value, for clients that read ``structuredContent``."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
