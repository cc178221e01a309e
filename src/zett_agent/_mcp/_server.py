"""The MCP server: an ``AsyncSubAgentExtension``'s task tools over stdio, with the ``mcp`` SDK.

The tools are the extension's own (``build_tools``), called as the agent path calls them, so
their arguments, results and errors are exactly what a model using the extension sees: a
result is the tool's JSON text (and the same value as ``structuredContent``), a bad call is a
tool result with ``isError`` and the short text that says how to fix it.

One stdio connection is one client and one extension session. Nothing outlives it: when the
client goes away (its end of stdin closes: it exited, crashed or was killed) the extension is
closed, which kills every child's process tree, before the server exits; a SIGTERM, SIGINT or
SIGHUP does the same, then the server dies of that signal. (SIGKILL of the server itself is the
process engine's case: its launcher kills every tree when its host dies.)

Only this module imports the SDK; ``zett_agent.cli`` imports it only for ``zett-agent mcp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from zett_agent._mcp._watch import BellRunner, Bells
from zett_agent.extensions._async_subagent import AsyncSubAgentExtension
from zett_agent.extensions._subagent import warm_up
from zett_agent.extensions._tasks._task import SubAgentTask
from zett_agent.process import Sandbox
from zett_agent.runners import ProcessRunner
from zett_agent.tools import AgentTool, ToolArgumentError, UnknownToolError

if TYPE_CHECKING:
    from mcp.server import ServerRequestContext

    from zett_agent.agent import AgentRunContext
    from zett_agent.extensions._definition import SubAgentDefinition

log = logging.getLogger(__name__)

#: the extension session of the (one) client of a stdio server
SESSION_ID = "mcp"

#: least seconds between two progress notifications of one call: a child that reports a
#: thousand times a second costs the client ten notifications a second
PROGRESS_INTERVAL = 0.1

#: the signals that close the server (and every child) before it dies of them
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: what the MCP client is told about the tools that only read
_ANNOTATIONS = {
    "task_list": types.ToolAnnotations(read_only_hint=True),
    "task_status": types.ToolAnnotations(read_only_hint=True),
    "task_output": types.ToolAnnotations(read_only_hint=True),
    "task_cancel": types.ToolAnnotations(destructive_hint=True, idempotent_hint=True),
}


class _Client:
    """The parent as the extension sees it: the MCP client, open until its connection ends."""

    closed = False


class _ToolContext:
    """What the task tools read of their ``AgentRunContext``, and all of it.

    ``build_tools`` and ``start`` read ``session_id``, ``agent`` (recorded as a user of the
    session; ``closed`` refuses new starts) and ``model`` (the parent's model, which a
    definition with ``model=None`` would get: the server refuses those, so it is ``None``).
    Anything else a tool asks for fails that call with an ``AttributeError`` naming it.
    """

    model = None

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.agent = _Client()


class TaskTools:
    """One client's task tools, as MCP ``tools/list`` and ``tools/call`` answer them."""

    def __init__(self, extension: AsyncSubAgentExtension, bells: Bells, session_id: str) -> None:
        self.extension = extension
        self.session_id = session_id
        self._bells = bells
        self._context = _ToolContext(session_id)
        built = extension.build_tools(cast("AgentRunContext", self._context), extension.subagents)
        self._tools: dict[str, AgentTool] = {tool.name: tool for tool in built}

    def close(self) -> None:
        """No task starts from this client any more (its connection ended)."""
        self._context.agent.closed = True

    def listing(self) -> list[types.Tool]:
        return [
            types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=dict(tool.parameters),
                annotations=_ANNOTATIONS.get(tool.name),
            )
            for tool in self._tools.values()
        ]

    async def call(
        self, name: str, arguments: dict[str, Any], ctx: ServerRequestContext[Any, Any] | None
    ) -> types.CallToolResult:
        """Run one tool and answer as MCP does; never raises for a bad call.

        While a call that names a running task (``task_output`` waiting for it, ``task_cancel``
        until its tree is gone) is in progress, the child's progress goes to the client as
        ``notifications/progress``, if its request asked for them with a progress token.

        Cancellation: cancelling the call (the client's ``notifications/cancelled``) stops the
        wait, never the task: as in the agent path, only ``task_cancel`` stops a task.
        """
        tool = self._tools.get(name)
        if tool is None:
            return _failed(str(UnknownToolError(name, list(self._tools))))
        forwarder = None
        task = self._named_task(arguments)
        if task is not None and ctx is not None and _progress_token(ctx) is not None:
            forwarder = asyncio.get_running_loop().create_task(self._forward_progress(ctx, task))
        try:
            result = await tool.invoke(arguments)
        except ToolArgumentError as exc:
            return _failed(str(exc))
        except Exception as exc:  # what the agent path makes of a tool's error, word for word
            return _failed(f"{tool.name} failed: {type(exc).__name__}: {exc}")
        finally:
            if forwarder is not None:
                forwarder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await forwarder
        text = result.text
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content=_json_object(text),
            is_error=result.is_error,
        )

    def _named_task(self, arguments: dict[str, Any]) -> SubAgentTask | None:
        task_id = arguments.get("task_id")
        if not isinstance(task_id, str):
            return None
        try:
            task = self.extension.get_task(self.session_id, task_id)
        except ValueError:
            return None  # the tool itself says what is wrong with it
        return None if task.done() else task

    async def _forward_progress(
        self, ctx: ServerRequestContext[Any, Any], task: SubAgentTask
    ) -> None:
        """Send the task's progress now, then each time it changes, until cancelled.

        At most one notification every ``PROGRESS_INTERVAL`` seconds. A failed send (the
        client went away) ends it quietly.
        """
        sent = 0
        last = None
        with self._bells.watch(task.session_id) as bell:
            while not task.done():
                message = _progress_message(task)
                if message != last:
                    last = message
                    sent += 1  # the spec asks progress to grow with every notification
                    try:
                        await ctx.session.report_progress(sent, None, message)
                    except Exception:
                        log.debug("progress of %s not sent; stopped", task.task_id, exc_info=True)
                        return
                    await asyncio.sleep(PROGRESS_INTERVAL)
                await bell.wait()
                bell.clear()


def _progress_token(ctx: ServerRequestContext[Any, Any]) -> object:
    meta = ctx.meta
    return meta.get("progress_token") if meta else None


def _count(value: object) -> str:
    # a child shapes these numbers: never format an unbounded int
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**18:
        return str(value)
    return "?"


def _progress_message(task: SubAgentTask) -> str:
    """One short line: what the child did so far, as the task shows it."""
    parts = [task.status.value, f"turn {_count(task.turns)}"]
    if task.tool_calls:
        last = f" (last: {task.last_tool})" if task.last_tool else ""
        parts.append(f"{_count(task.tool_calls)} tool calls{last}")
    if task.progress is not None:
        done, total = task.progress.get("done"), task.progress.get("total")
        parts.append(
            f"{_count(done)} of {_count(total)} done"
            if total is not None
            else (f"{_count(done)} done")
        )
    return ", ".join(parts)


def _failed(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def _json_object(text: str) -> dict[str, Any] | None:
    """The tool's JSON result as a value, for clients that read ``structuredContent``."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zett-agent")
    except PackageNotFoundError:
        return "0"


def build_server(tools: TaskTools) -> Server[Any]:
    """The lowlevel MCP server answering ``tools/list`` and ``tools/call`` with ``tools``."""
    profiles = "; ".join(f"{d.name}: {d.description}" for d in tools.extension.subagents)

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools.listing())

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await tools.call(params.name, dict(params.arguments or {}), ctx)

    return Server(
        "zett-agent",
        version=_version(),
        instructions=(
            "Background child agents, each in its own OS process. task_start starts one and "
            "returns its task_id at once; task_output reads its report (waiting up to "
            "wait_seconds, with progress notifications); task_cancel kills it. Profiles: "
            f"{profiles}"
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def make_extension(
    definitions: Sequence[SubAgentDefinition], *, max_concurrent: int, sandbox: bool
) -> tuple[AsyncSubAgentExtension, Bells]:
    """The extension a server runs, and the bells its children ring.

    Raises:
        TypeError, ValueError: a bad option or definition (the extension's own message).
    """
    bells = Bells()
    inner = ProcessRunner()
    inner.owner = "zett-agent mcp"
    extension = AsyncSubAgentExtension(
        definitions,
        max_concurrent=max_concurrent,
        notify_parent=False,  # the client reads reports with task_output; no one to notify
        runner=BellRunner(inner, bells),
        sandbox=Sandbox() if sandbox else None,
    )
    return extension, bells


async def serve_stdio(extension: AsyncSubAgentExtension, bells: Bells) -> None:
    """Serve one client on stdin and stdout until it goes away, then close ``extension``.

    While serving, fd 0 reads ``/dev/null`` and fd 1 writes to stderr (the SDK's stdio
    transport moves the wire to private descriptors), so children, which inherit both, can
    neither read the client's requests nor write into its answers.

    On SIGTERM, SIGINT or SIGHUP: the extension is closed (every child's tree killed), then
    the process dies of that signal. A blocked read of stdin cannot be interrupted, so the
    server does not wait for it.
    """
    loop = asyncio.get_running_loop()
    tools = TaskTools(extension, bells, SESSION_ID)
    server = build_server(tools)
    stopping: list[asyncio.Task[None]] = []  # the one task that closes and dies, once started

    def stop(signum: signal.Signals) -> None:
        if not stopping:
            stopping.append(loop.create_task(_die_of(signum, extension)))

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        async with stdio_server() as (read_stream, write_stream):
            # Boot the process pool now, with fds 0 and 1 moved away: the first task_start
            # then finds it ready.
            warm_up(extension, None)
            await server.run(read_stream, write_stream, server.create_initialization_options())
    except* (BrokenPipeError, ConnectionResetError):
        # the client went away while an answer was on its way (the answer to a call its
        # going away cancelled): that is the end of this connection, not an error
        log.debug("the client went away", exc_info=True)
    finally:
        tools.close()
        await extension.close()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


async def _die_of(signum: signal.Signals, extension: AsyncSubAgentExtension) -> None:
    try:
        await extension.close()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
