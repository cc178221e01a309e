"""The official SDK's client, with the MCP tasks of protocol 2025-11-25.

The SDK (2.3) ships the task types (``GetTaskRequest``, ``CreateTaskResult``,
``TaskStatusNotification``...) but no task API in its client, and its ``call_tool`` checks
every answer as a ``CallToolResult``, which a ``CreateTaskResult`` is not. So a task client is
built here from the SDK's own public parts: its transports (stdio, Streamable HTTP), its
JSON-RPC dispatcher and its ``ClientSession``, which sends the ``tasks/*`` requests as the
SDK's types and delivers ``notifications/tasks/status`` through a notification binding. Only
the task-augmented ``tools/call`` goes through the dispatcher itself, then is checked as the
SDK's ``CreateTaskResult``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from mcp import ClientSession, types
from mcp.client.extension import NotificationBinding
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher


class TaskClient:
    """A client session that speaks the tasks of 2025-11-25 through the SDK."""

    def __init__(self, session: ClientSession, dispatcher: JSONRPCDispatcher[Any]) -> None:
        self.session = session
        self.dispatcher = dispatcher
        #: every notifications/tasks/status received, in order
        self.statuses: list[types.TaskStatusNotificationParams] = []
        self.status_arrived = asyncio.Event()

    async def on_status(self, params: types.TaskStatusNotificationParams) -> None:
        self.statuses.append(params)
        self.status_arrived.set()

    async def wait_status(self, task_id: str, status: str) -> types.TaskStatusNotificationParams:
        """The first status notification of ``task_id`` with ``status`` (waiting for it)."""
        while True:
            for params in self.statuses:
                if params.task_id == task_id and params.status == status:
                    return params
            self.status_arrived.clear()
            await self.status_arrived.wait()

    async def call_as_task(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        ttl: int | None = None,
        on_progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None,
    ) -> types.CreateTaskResult:
        params: dict[str, Any] = {"name": name, "arguments": arguments, "task": {}}
        if ttl is not None:
            params["task"]["ttl"] = ttl
        options: dict[str, Any] = {}
        if on_progress is not None:
            options["on_progress"] = on_progress
        raw = await self.dispatcher.send_raw_request("tools/call", params, options or None)  # type: ignore[arg-type]
        return types.CreateTaskResult.model_validate(raw)

    async def get(self, task_id: str) -> types.GetTaskResult:
        request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
        return await self.session.send_request(request, types.GetTaskResult)

    async def result(self, task_id: str) -> types.CallToolResult:
        request = types.GetTaskPayloadRequest(
            params=types.GetTaskPayloadRequestParams(task_id=task_id)
        )
        return await self.session.send_request(request, types.CallToolResult)

    async def list(self, cursor: str | None = None) -> types.ListTasksResult:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        return await self.session.send_request(
            types.ListTasksRequest(params=params), types.ListTasksResult
        )

    async def cancel(self, task_id: str) -> types.CancelTaskResult:
        request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
        return await self.session.send_request(request, types.CancelTaskResult)


@asynccontextmanager
async def task_client(
    transport: AbstractAsyncContextManager[tuple[Any, Any]],
) -> AsyncIterator[TaskClient]:
    """A ``TaskClient`` over ``transport`` (``stdio_client(...)``, ``streamable_http_client(...)``),
    initialized (the handshake negotiates 2025-11-25)."""
    async with transport as (read_stream, write_stream):
        dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(read_stream, write_stream)
        holder: list[TaskClient] = []

        async def on_status(params: types.TaskStatusNotificationParams) -> None:
            await holder[0].on_status(params)

        session = ClientSession(
            dispatcher=dispatcher,
            notification_bindings=[
                NotificationBinding(
                    method="notifications/tasks/status",
                    params_type=types.TaskStatusNotificationParams,
                    handler=on_status,
                )
            ],
        )
        client = TaskClient(session, dispatcher)
        holder.append(client)
        async with session:
            await session.initialize()
            yield client
