"""The MCP server: the SDK's lowlevel ``Server`` answering for the client each request is from.

It serves, to every client, the extension's five task tools and a tool per child
(``_child_tools``); at protocol revision 2025-11-25 also MCP tasks: the ``tasks`` capability,
task-augmented ``tools/call`` and ``tasks/get``, ``tasks/result``, ``tasks/list``,
``tasks/cancel`` (``_tasks``). The pinned SDK (2.3) has the task types but dispatches none of
them, so their handling is here: the ``tasks/*`` methods are request handlers of their own;
a task-augmented call's answer (a ``CreateTaskResult``, which the SDK would check as a
``CallToolResult`` and refuse) leaves the call's handler as ``_Answer`` and goes out through a
middleware as it is; the capability is added to the ``initialize`` answer the same way, only
when 2025-11-25 was negotiated. At other revisions ``tasks/*`` are unknown methods (-32601) and
a call's ``task`` field is ignored, as the spec asks of a server that does not declare tasks.

Which client a request is from is the transport's to say (``Clients``): a stdio server has
one; an HTTP server one per session.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from mcp import MCPError, types
from mcp.server.lowlevel import Server
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND

from zett_agent._mcp._child_tools import ChildTool, child_answer
from zett_agent._mcp._client import CallRefused, McpClient, Notify
from zett_agent._mcp._tasks import TaskError
from zett_agent._mcp._watch import BellRunner, Bells
from zett_agent.extensions._async_subagent import AsyncSubAgentExtension
from zett_agent.process import Sandbox
from zett_agent.runners import ProcessRunner

if TYPE_CHECKING:
    from mcp.server import ServerRequestContext
    from mcp.server.context import CallNext, HandlerResult

    from zett_agent._mcp._progress import Send
    from zett_agent.extensions._definition import SubAgentDefinition

__all__ = [
    "RELATED_TASK",
    "TASKS_CAPABILITY",
    "TASKS_VERSION",
    "Clients",
    "build_server",
    "child_tools_of",
    "make_extension",
]

log = logging.getLogger(__name__)

#: the protocol revision whose tasks the server serves
TASKS_VERSION = "2025-11-25"

#: the ``tasks`` capability it declares at that revision
TASKS_CAPABILITY: dict[str, Any] = {
    "list": {},
    "cancel": {},
    "requests": {"tools": {"call": {}}},
}

#: the ``_meta`` key that ties a ``tasks/result`` answer to its task
RELATED_TASK = "io.modelcontextprotocol/related-task"

#: what a host may show its model at once for a call that became a task
_IMMEDIATE = "io.modelcontextprotocol/model-immediate-response"

#: what the MCP client is told about the tools that only read
_ANNOTATIONS = {
    "task_list": types.ToolAnnotations(read_only_hint=True),
    "task_status": types.ToolAnnotations(read_only_hint=True),
    "task_output": types.ToolAnnotations(read_only_hint=True),
    "task_cancel": types.ToolAnnotations(destructive_hint=True, idempotent_hint=True),
}


class Clients(Protocol):
    """The transport's side: which client a request is from."""

    def client_of(self, ctx: ServerRequestContext[Any, Any]) -> McpClient:
        """The client that sent the request of ``ctx``.

        Raises:
            MCPError: the request belongs to no client (a session that is gone).
        """
        ...


class _Answer(Exception):
    """Carries a handler's answer past the SDK's result check, to ``_pass_answers``."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("an answer on its way out")
        self.result = result


def child_tools_of(extension: AsyncSubAgentExtension) -> dict[str, ChildTool]:
    """A tool per definition the extension serves, by name."""
    return {d.name: ChildTool(extension, d) for d in extension.subagents}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zett-agent")
    except PackageNotFoundError:
        return "0"


def _progress_token(ctx: ServerRequestContext[Any, Any]) -> str | int | None:
    meta = ctx.meta
    token = meta.get("progress_token") if meta else None
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


#: the notifications a client is sent outside its requests, by method
_NOTIFICATIONS: dict[str, type[types.Notification[Any, Any]]] = {
    "notifications/tasks/status": types.TaskStatusNotification,
    "notifications/progress": types.ProgressNotification,
}


def _notifier(ctx: ServerRequestContext[Any, Any]) -> Notify:
    """Send a notification on the connection of ``ctx``, outside any request."""
    session = ctx.session

    async def notify(method: str, params: dict[str, Any]) -> None:
        notification = _NOTIFICATIONS[method].model_validate({"method": method, "params": params})
        await session.send_notification(cast("types.ServerNotification", notification))

    return notify


def _tool_listing(client: McpClient) -> list[types.Tool]:
    tools = [
        types.Tool(
            name=tool.name,
            description=tool.description,
            input_schema=dict(tool.parameters),
            annotations=_ANNOTATIONS.get(tool.name),
        )
        for tool in client.task_tools.values()
    ]
    tools.extend(
        types.Tool(
            name=tool.name,
            description=tool.description,
            input_schema=tool.input_schema,
            execution=types.ToolExecution(task_support="optional"),
        )
        for tool in client.child_tools.values()
    )
    return tools


def build_server(extension: AsyncSubAgentExtension, clients: Clients) -> Server[Any]:
    """The lowlevel MCP server of ``extension``'s children, for the clients ``clients`` knows."""
    profiles = "; ".join(f"{d.name}: {d.description}" for d in extension.subagents)

    def client_of(ctx: ServerRequestContext[Any, Any]) -> McpClient:
        client = clients.client_of(ctx)
        client.connect(_notifier(ctx))
        return client

    def tasks_client(ctx: ServerRequestContext[Any, Any]) -> McpClient:
        if ctx.protocol_version != TASKS_VERSION:
            raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data=ctx.method)
        return client_of(ctx)

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_tool_listing(client_of(ctx)))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        client = client_of(ctx)
        arguments = dict(params.arguments or {})
        if params.task is not None and ctx.protocol_version == TASKS_VERSION:
            try:
                task = await client.start_task(
                    params.name,
                    arguments,
                    ttl=params.task.ttl,
                    progress_token=_progress_token(ctx),
                )
            except CallRefused as exc:
                raise MCPError(code=exc.code, message=str(exc)) from None
            raise _Answer(
                {
                    "task": task.wire(),
                    "_meta": {
                        _IMMEDIATE: (
                            f"Started {params.name} as task {task.task_id}; it runs in the "
                            "background."
                        )
                    },
                }
            )
        progress: Send | None = None
        if _progress_token(ctx) is not None:

            async def progress(value: int, line: str) -> None:
                await ctx.session.report_progress(value, None, line)

        answer = await client.call(params.name, arguments, progress)
        return types.CallToolResult(
            content=[types.TextContent(text=answer.text)],
            structured_content=answer.structured,
            is_error=answer.is_error,
        )

    async def tasks_get(
        ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
    ) -> dict[str, Any]:
        client = tasks_client(ctx)
        return _task_answer(lambda: client.tasks.get(params.task_id).wire())

    async def tasks_result(
        ctx: ServerRequestContext[Any, Any], params: types.GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        client = tasks_client(ctx)
        try:
            task = await client.tasks.result(params.task_id)
        except TaskError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        result = child_answer(extension, task.child, cancelled=task.cancelled).wire()
        result["_meta"] = {RELATED_TASK: {"taskId": task.task_id}}
        return result

    async def tasks_list(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
    ) -> dict[str, Any]:
        client = tasks_client(ctx)

        def page() -> dict[str, Any]:
            tasks, cursor = client.tasks.page(params.cursor)
            answer: dict[str, Any] = {"tasks": [task.wire() for task in tasks]}
            if cursor is not None:
                answer["nextCursor"] = cursor
            return answer

        return _task_answer(page)

    async def tasks_cancel(
        ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
    ) -> dict[str, Any]:
        client = tasks_client(ctx)
        try:
            task = await client.tasks.cancel(params.task_id)
        except TaskError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        return task.wire()

    server: Server[Any] = Server(
        "zett-agent",
        version=_version(),
        instructions=(
            "Background child agents, each in its own OS process. Each child is a tool of its "
            "own: called plainly it runs the child and answers with its report; called as a "
            "task (protocol 2025-11-25) it answers at once, and tasks/get, tasks/result and "
            "tasks/cancel follow it. The task tools do the same for any client: task_start "
            "starts one and returns its task_id at once; task_output reads its report "
            "(waiting up to wait_seconds, with progress notifications); task_cancel kills it. "
            f"Children: {profiles}"
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, tasks_get)
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, tasks_result)
    server.add_request_handler("tasks/list", types.PaginatedRequestParams, tasks_list)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, tasks_cancel)
    server.middleware.append(_pass_answers)
    return server


def _task_answer(answer: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = answer()
    except TaskError as exc:
        raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
    return result


async def _pass_answers(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """The innermost middleware: answers the SDK's checks would refuse, and the capability.

    A task-augmented call's ``CreateTaskResult`` goes out as it is; an ``initialize`` answer
    that negotiated ``TASKS_VERSION`` gets the ``tasks`` capability.
    """
    try:
        result = await call_next(ctx)
    except _Answer as answer:
        return answer.result
    if ctx.method == "initialize" and isinstance(result, dict):
        capabilities = result.get("capabilities")
        if result.get("protocolVersion") == TASKS_VERSION and isinstance(capabilities, dict):
            capabilities["tasks"] = json.loads(json.dumps(TASKS_CAPABILITY))
    return result


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
        notify_parent=False,  # the client reads reports itself; no parent model to notify
        runner=BellRunner(inner, bells),
        sandbox=Sandbox() if sandbox else None,
    )
    return extension, bells
