"""One client's MCP task table (``_mcp._tasks``) on its own: its bounds, with fakes.

The children are bare ``SubAgentTask`` records moved through their statuses by the test; the
extension is a fake whose ``cancel`` ends them. The whole protocol runs over real processes in
``test_mcp_tasks.py``; here the bounds that take too many children to reach that way.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: uv sync --extra mcp")

from zett_agent._mcp._tasks import DEFAULT_TTL_MS, MIN_TTL_MS, PAGE_SIZE, McpTasks, TaskError
from zett_agent._mcp._watch import Bells
from zett_agent.extensions._tasks._task import SubAgentTask, SubAgentTaskStatus


class FakeExtension:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def cancel(self, task: SubAgentTask) -> SubAgentTask:
        self.cancelled.append(task.task_id)
        if not task.done():
            task.error = "cancelled"
            task.transition(SubAgentTaskStatus.CANCELLED)
        return task


def child(number: int) -> SubAgentTask:
    return SubAgentTask(f"task-{number}", "client", f"child-{number}", "worker", "d", "p")


def table(*, max_retained: int = 3, max_ttl_ms: int = 60_000) -> tuple[McpTasks, FakeExtension]:
    sent: list[tuple[str, dict[str, Any]]] = []

    async def notify(method: str, params: dict[str, Any]) -> None:
        sent.append((method, params))

    extension = FakeExtension()
    tasks = McpTasks(
        extension,  # type: ignore[arg-type]
        Bells(),
        notify,
        max_ttl_ms=max_ttl_ms,
        max_retained=max_retained,
    )
    return tasks, extension


async def test_the_lifetime_granted_is_the_one_asked_within_the_bounds() -> None:
    tasks, _ = table(max_ttl_ms=10_000)
    assert tasks.granted_ttl(None) == 10_000  # the default, within the maximum
    assert tasks.granted_ttl(5) == MIN_TTL_MS
    assert tasks.granted_ttl(7_000) == 7_000
    assert tasks.granted_ttl(10**15) == 10_000
    assert table(max_ttl_ms=10**9)[0].granted_ttl(None) == DEFAULT_TTL_MS
    await tasks.close()


async def test_beyond_max_retained_the_oldest_finished_are_deleted() -> None:
    tasks, _ = table(max_retained=3)
    children = [child(n) for n in range(6)]
    made = [tasks.create(c, "worker", ttl=None, progress_token=None) for c in children]
    for c in children[:5]:  # the last one keeps running
        c.transition(SubAgentTaskStatus.COMPLETED)
    kept = [t.task_id for t in tasks.tasks()]
    assert kept == [made[2].task_id, made[3].task_id, made[4].task_id, made[5].task_id]
    with pytest.raises(TaskError, match="Task has expired"):
        tasks.get(made[0].task_id)
    await tasks.close()


async def test_a_client_that_left_keeps_only_its_running_tasks() -> None:
    tasks, _ = table()
    done, running = child(1), child(2)
    first = tasks.create(done, "worker", ttl=None, progress_token=None)
    second = tasks.create(running, "worker", ttl=None, progress_token=None)
    done.transition(SubAgentTaskStatus.COMPLETED)
    tasks.orphan()
    assert [t.task_id for t in tasks.tasks()] == [second.task_id]
    assert not tasks.empty.is_set()
    running.transition(SubAgentTaskStatus.FAILED)
    assert tasks.tasks() == [] and tasks.empty.is_set()
    with pytest.raises(TaskError):
        tasks.get(first.task_id)
    await tasks.close()


async def test_cursors_page_in_order_and_nothing_else_is_a_cursor() -> None:
    tasks, _ = table(max_retained=100)
    made = [tasks.create(child(n), "worker", ttl=None, progress_token=None) for n in range(45)]
    seen, cursor = [], None
    while True:
        page, cursor = tasks.page(cursor)
        assert len(page) <= PAGE_SIZE
        seen += [t.task_id for t in page]
        if cursor is None:
            break
    assert seen == [t.task_id for t in made]
    for bad in ("", "x" * 100, "after:1", "YWZ0ZXI6LTE", "\u00e9"):
        with pytest.raises(TaskError, match="Invalid cursor"):
            tasks.page(bad)
    await tasks.close()
