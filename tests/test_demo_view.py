"""The demo's table at 80 and 120 columns, its live rows and its progress line."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from zett_agent._demo._view import LiveTasks, progress_line, task_table
from zett_agent.extensions.async_subagent import SubAgentTask, SubAgentTaskStatus


def info(n: int, kind: str, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "task_id": f"task-{n}",
        "subagent_type": kind,
        "description": f"{kind} number {n} with a long description that will not fit anywhere",
        "status": status,
        "pid": 4_000_000 + n if status == "running" else None,
        "elapsed_seconds": 123.4,
        "cpu_seconds": 98.76,
        "peak_memory_bytes": 123 * 2**20,
        "turns": 2,
        "last_tool": {"hasher": "hash_files", "spinner": "spin_forever"}.get(kind, "crash"),
        **extra,
    }


INFOS = [
    info(1, "hasher", "running", progress={"done": 1234, "total": 5678}),
    info(2, "hasher", "completed", progress={"done": 14, "total": 14}, content="hashed 14 files"),
    info(99, "hasher", "pending"),
    info(100, "spinner", "cancelled", error="cancelled"),
    info(101, "crasher", "failed", error="the child process was killed by SIGSEGV"),
]


def render(renderable: Any, width: int, height: int = 50) -> list[str]:
    out = Console(
        file=io.StringIO(), width=width, height=height, force_terminal=False, color_system=None
    )
    out.print(renderable)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in text.splitlines()]


@pytest.mark.parametrize("width", [80, 120])
def test_every_task_id_and_type_is_whole_at_80_and_120_columns(width: int) -> None:
    lines = render(task_table(INFOS, width=width), width)
    assert all(len(line) <= width for line in lines)
    rows = {line.split()[0]: line for line in lines if line.startswith("task-")}
    assert sorted(rows) == sorted(i["task_id"] for i in INFOS)
    for item in INFOS:
        row = rows[item["task_id"]]
        assert row.split()[1] == item["subagent_type"]
        assert item["status"] in row.split()
    assert "1234/5678" in rows["task-1"] and "14/14" in rows["task-2"]
    assert str(4_000_001) in rows["task-1"]  # the pid of a running task
    assert "98.76" in rows["task-1"] and "123.4s" in rows["task-1"]


def test_80_columns_drop_memory_turns_and_last_tool_and_cut_the_result() -> None:
    lines = render(task_table(INFOS, width=80), 80)
    header = next(line for line in lines if line.startswith("task"))
    assert header.split() == [
        "task",
        "type",
        "status",
        "pid",
        "files",
        "CPU",
        "s",
        "time",
        "result",
    ]
    assert not any("spin_forever" in line or "MiB" in line for line in lines)
    crasher = next(line for line in lines if line.startswith("task-101"))
    assert " the child" in crasher and crasher.endswith("…")  # cut with an ellipsis, not wrapped


def test_120_columns_show_memory_turns_and_the_last_tool() -> None:
    lines = render(task_table(INFOS, width=120), 120)
    header = next(line for line in lines if line.startswith("task"))
    assert re.split(r"\s{2,}", header)[:10] == [
        "task",
        "type",
        "status",
        "pid",
        "files",
        "mem",
        "CPU s",
        "time",
        "turns",
        "last tool",
    ]
    spinner = next(line for line in lines if line.startswith("task-100"))
    assert "spin_forever" in spinner and "123 MiB" in spinner


class Registry:
    """What LiveTasks reads of the extension: its tasks, per session."""

    def __init__(self, tasks: list[SubAgentTask]) -> None:
        self._tasks = tuple(tasks)

    def tasks(self, session_id: str) -> tuple[SubAgentTask, ...]:
        return self._tasks if session_id == "demo" else ()


def task(n: int, kind: str, status: SubAgentTaskStatus, done: int | None = None) -> SubAgentTask:
    record = SubAgentTask(f"task-{n}", "demo", f"demo/task-{n}", kind, f"{kind} {n}", "go")
    if status is not SubAgentTaskStatus.PENDING:
        record.transition(SubAgentTaskStatus.RUNNING)
    if status.terminal:
        record.transition(status)
    if done is not None:
        record.progress = {"done": done, "total": 10}
    return record


def test_live_rows_fit_the_terminal_and_count_every_file() -> None:
    tasks = [task(n, "hasher", SubAgentTaskStatus.COMPLETED, done=10) for n in range(1, 100)]
    tasks += [task(100, "spinner", SubAgentTaskStatus.CANCELLED)]
    tasks += [task(101, "crasher", SubAgentTaskStatus.RUNNING)]
    out = Console(file=io.StringIO(), width=80, height=20, color_system=None)
    view = LiveTasks(out, "demo", total_files=990)
    assert "starting" in render(view(), 80)[0]  # before the extension exists
    view.attach(Registry([]))  # type: ignore[arg-type]
    assert render(view(), 80)[1].split()[:3] == ["task", "type", "status"]  # no task yet
    view.attach(Registry(tasks))  # type: ignore[arg-type]
    lines = render(view(), 80, 20)
    rows = [line for line in lines if line.startswith("task-")]
    assert 0 < len(rows) <= 20
    hidden = 101 - len(rows)
    assert any(line.split()[:3] == ["…", str(hidden), "more"] for line in lines)
    assert any("files hashed: 990 of 990" in line for line in lines)


def test_progress_line_counts_files_and_statuses() -> None:
    tasks = [
        task(1, "hasher", SubAgentTaskStatus.RUNNING, done=3),
        task(2, "hasher", SubAgentTaskStatus.COMPLETED, done=10),
        task(3, "spinner", SubAgentTaskStatus.CANCELLED),
    ]
    line = progress_line(tasks, 20, 4.25)
    assert line == "   4.2 s  files hashed: 13 of 20  (1 running, 1 completed, 1 cancelled)"
    assert progress_line([], 20, 0.0).endswith("files hashed: 0 of 20  (starting)")


def test_a_frame_that_fails_to_draw_keeps_the_last_one() -> None:
    """rich's refresh thread must never die (the view would freeze): a bad frame is skipped."""

    class Broken:
        def tasks(self, session_id: str) -> tuple[SubAgentTask, ...]:
            raise RuntimeError("OrderedDict mutated during iteration")

    out = Console(file=io.StringIO(), width=80, height=20, color_system=None)
    view = LiveTasks(out, "demo", total_files=1)
    view.attach(Registry([task(1, "hasher", SubAgentTaskStatus.RUNNING, done=1)]))  # type: ignore[arg-type]
    good = view()
    view.attach(Broken())  # type: ignore[arg-type]
    assert view() is good
