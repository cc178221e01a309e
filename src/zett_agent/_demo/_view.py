"""The demo's terminal view (rich): a live task table, progress lines and a closing summary.

The live table is drawn by rich's own refresh thread at a bounded rate, never on the event loop:
the parent's loop only supervises children, so the loop stall the demo reports is the
supervisor's, not the cost of drawing. Rows are read from the task records (plain attributes)
and, for running children, from ``/proc`` through psutil, in that thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
)

log = logging.getLogger(__name__)

#: Refreshes per second of the live table (rich's thread; the loop does not wait for them).
REFRESH_PER_SECOND = 4
#: Console widths from which the less important columns come back.
WIDE, WIDER = 100, 120
#: Lines the table needs besides its rows (title, header, rule, caption, a hidden-rows line).
TABLE_CHROME = 6

_STYLE = {
    "pending": "dim",
    "running": "cyan",
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
}


def _mib(value: Any) -> str:
    return f"{value / 2**20:.0f} MiB" if value else "-"


def _files(info: dict[str, Any]) -> str:
    progress = info.get("progress")
    if not isinstance(progress, dict):
        return "-"
    total = progress.get("total")
    return f"{progress.get('done', 0)}/{total}" if total is not None else str(progress["done"])


def files_done(tasks: Sequence[SubAgentTask]) -> int:
    """Files the hashers reported hashed, summed."""
    return sum(
        task.progress.get("done", 0)
        for task in tasks
        if task.subagent_type == "hasher" and task.progress is not None
    )


_Cell = Callable[[dict[str, Any]], str]


def _columns(width: int, node: bool = False) -> list[tuple[str, _Cell, bool]]:
    """``(header, cell, right-aligned)`` of each column shown at ``width``, the result aside.

    With ``node`` (children on Ray), the node each task runs on (its id's first 8 digits).
    """
    columns: list[tuple[str, _Cell, bool]] = [
        ("task", lambda i: str(i.get("task_id")), False),
        ("type", lambda i: str(i.get("subagent_type")), False),
        ("status", lambda i: str(i.get("status", "")), False),
        ("pid", lambda i: str(i.get("pid") or "-"), False),
    ]
    if node:
        columns.append(("node", lambda i: str(i.get("node_id") or "-")[:8], False))
    columns += [
        ("files", _files, False),
    ]
    if width >= WIDE:
        columns.append(("mem", lambda i: _mib(i.get("peak_memory_bytes")), True))
    columns += [
        ("CPU s", lambda i: f"{i.get('cpu_seconds', 0):.2f}", True),
        ("time", lambda i: f"{i.get('elapsed_seconds', 0):.1f}s", True),
    ]
    if width >= WIDER:
        columns += [
            ("turns", lambda i: str(i.get("turns", 0)), True),
            ("last tool", lambda i: str(i.get("last_tool") or "-"), False),
        ]
    return columns


def task_table(
    infos: Sequence[dict[str, Any]],
    *,
    width: int,
    title: str = "background tasks",
    caption: str | None = None,
    hidden: int = 0,
) -> Text:
    """The task table for a console ``width`` columns wide, as one styled ``Text``.

    Formatted by hand rather than with ``rich.table.Table``, whose layout costs about 10 ms of
    CPU a frame: the live view redraws it several times a second in a thread that shares the
    GIL with the event loop. Every column is as wide as its widest cell, so the columns that
    tell tasks apart (task id, type) are never cut; the result takes what is left and is cut
    with an ellipsis. At 80 columns the table keeps status, pid, files, CPU and time; memory
    comes back from ``WIDE`` columns, turns and the last tool from ``WIDER``.
    """
    columns = _columns(width, node=any("node_id" in info for info in infos))
    cells = [[cell(info) for _, cell, _ in columns] for info in infos]
    if hidden:
        cells.append(["…", f"{hidden} more", *([""] * (len(columns) - 2))])
    widths = [
        max([len(header), *(len(row[n]) for row in cells)])
        for n, (header, _, _) in enumerate(columns)
    ]
    used = sum(widths) + 2 * len(widths)
    room = max(8, width - used)

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            value.rjust(w) if right else value.ljust(w)
            for value, w, (_, _, right) in zip(values, widths, columns, strict=True)
        )

    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(title.center(min(width, used + room)).rstrip() + "\n", style="italic")
    text.append(line([header for header, _, _ in columns]) + "  result\n", style="bold")
    text.append("─" * min(width, used + room) + "\n")
    status_at = [header for header, _, _ in columns].index("status")
    for n, row in enumerate(cells):
        start = len(text)
        text.append(line(row) + "  ")
        if n < len(infos):
            info = infos[n]
            detail = str(info.get("content") or info.get("error") or info.get("description", ""))
            detail = detail.splitlines()[0] if detail else ""
            text.append(detail if len(detail) <= room else detail[: room - 1] + "…")
            offset = start + sum(widths[:status_at]) + 2 * status_at
            style = _STYLE.get(str(info.get("status")), "")
            if style:
                text.stylize(style, offset, offset + widths[status_at])
        text.append("\n")
    if caption:
        text.append(caption.center(min(width, used + room)).rstrip(), style="italic")
    return text


class LiveTasks:
    """The live table of one session's tasks, for ``rich.live.Live(get_renderable=...)``.

    ``attach`` is called from the event loop once the extension exists; ``__call__`` runs in
    rich's refresh thread. It only reads task records (their fields are replaced whole, so a read
    sees an old or a new value, never a broken one) and ``/proc``.
    """

    def __init__(
        self, console: Console, session: str, total_files: int, *, ray: bool = False
    ) -> None:
        self.console = console
        self.session = session
        self.total_files = total_files
        #: children on Ray: a node column, and usage from the job (a pid may be remote)
        self.ray = ray
        self._extension: AsyncSubAgentExtension | None = None
        self._processes: dict[int, psutil.Process] = {}
        self._peaks: dict[str, int] = {}
        self._last: RenderableType = Text("starting the children...")
        self._lock = threading.Lock()
        self._begin = time.monotonic()

    def attach(self, extension: AsyncSubAgentExtension) -> None:
        self._extension = extension

    def warm_up(self) -> None:
        """Draw a sample table once, out of sight, before the loop starts.

        Rich fills its caches (character widths, styles) on first use, which would cost the first
        live frame several milliseconds of GIL time while the loop runs.
        """
        sample = {"task_id": "task-1", "subagent_type": "hasher", "status": "running", "pid": 1}
        with self.console.capture():
            self.console.print(task_table([sample], width=self.console.size.width))

    def __call__(self) -> RenderableType:
        extension = self._extension
        if extension is None:
            return self._last
        with self._lock:
            try:
                self._last = self._frame(extension)
            except Exception:
                # Whatever went wrong (the registry changed under our feet, say), rich's thread
                # must not die, or the view would freeze: show the last frame, retry next time.
                log.debug("drawing the live table failed", exc_info=True)
            return self._last

    def _frame(self, extension: AsyncSubAgentExtension) -> RenderableType:
        tasks = extension.tasks(self.session)
        room = max(3, self.console.size.height - TABLE_CHROME)
        shown, hidden = _visible(tasks, room)
        infos = [self._row(task) for task in shown]
        caption = (
            f"files hashed: {files_done(tasks)} of {self.total_files}; "
            f"{time.monotonic() - self._begin:.1f} s"
        )
        return task_table(infos, width=self.console.size.width, caption=caption, hidden=hidden)

    def _row(self, task: SubAgentTask) -> dict[str, Any]:
        status = task.status
        info: dict[str, Any] = {
            "task_id": task.task_id,
            "subagent_type": task.subagent_type,
            "description": task.description,
            "status": status.value,
            "pid": task.pid if status is SubAgentTaskStatus.RUNNING else None,
            "turns": task.turns,
            "last_tool": task.last_tool,
            "elapsed_seconds": task.elapsed,
            "cpu_seconds": task.cpu_seconds,
            "peak_memory_bytes": max(task.peak_memory_bytes, self._peaks.get(task.task_id, 0)),
            "progress": task.progress,
            "content": task.output,
            "error": task.error,
        }
        if self.ray:
            job = task.job
            info["node_id"] = job.info().get("node_id") if job is not None else None
            if job is not None and status is SubAgentTaskStatus.RUNNING:
                usage = job.usage()
                info["cpu_seconds"] = usage.cpu_seconds
                info["peak_memory_bytes"] = max(info["peak_memory_bytes"], usage.peak_rss_bytes)
            return info
        pid = info["pid"]
        if pid:
            try:
                process = self._processes.get(pid) or self._processes.setdefault(
                    pid, psutil.Process(pid)
                )
                with process.oneshot():
                    times = process.cpu_times()
                    rss = process.memory_info().rss
                info["cpu_seconds"] = times.user + times.system
                self._peaks[task.task_id] = max(self._peaks.get(task.task_id, 0), rss)
                info["peak_memory_bytes"] = self._peaks[task.task_id]
            except psutil.Error:
                self._processes.pop(pid, None)
        return info


def _visible(tasks: Sequence[SubAgentTask], room: int) -> tuple[Sequence[SubAgentTask], int]:
    """The first ``room`` tasks (one line kept for the count of the others) and that count."""
    if len(tasks) <= room:
        return tasks, 0
    return tasks[: room - 1], len(tasks) - (room - 1)


def progress_line(tasks: Sequence[SubAgentTask], total_files: int, elapsed: float) -> str:
    """One line for ``--plain``: files hashed of total and how many tasks are in each status."""
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.status.value] = counts.get(task.status.value, 0) + 1
    statuses = ", ".join(f"{n} {status}" for status, n in counts.items()) or "starting"
    return f"{elapsed:6.1f} s  files hashed: {files_done(tasks)} of {total_files}  ({statuses})"


def summary(data: dict[str, Any], *, width: int) -> Group:
    cancel = data.get("cancel_seconds")
    lines = []
    if data.get("timed_out"):
        lines.append(
            f"stopped by --timeout after {data['wall_seconds']:.1f} s: "
            f"{data.get('files_hashed', 0)} of {data['files']} files hashed; "
            "every child's process tree was killed"
        )
    lines += [
        f"wall time {data['wall_seconds']:.2f} s; children CPU time "
        f"{data['children_cpu_seconds']:.2f} s on {data['cpu_count']} cores: "
        f"parallel speedup x{data['parallel_speedup']}",
        "hard cancel: the spinner's process tree was killed and confirmed gone in "
        + (f"{cancel * 1000:.1f} ms" if cancel is not None else "(not cancelled)"),
        f"the parent kept working meanwhile (survey: {'; '.join(data['parent_work']) or '-'}); "
        f"its event loop never stalled more than {data['parent_loop_max_stall_ms']:.1f} ms "
        f"(p99 {data['parent_loop_p99_stall_ms']:.1f} ms)",
    ]
    for task in data["tasks"]:
        if task["status"] == "failed":
            lines.append(
                f"clean failure: {task['task_id']} ({task['subagent_type']}): {task.get('error')}"
            )
        if task["subagent_type"] == "snooper":
            lines.append(sandbox_line(task))
    parts: list[RenderableType] = [
        task_table(
            data["tasks"],
            width=width,
            title="final",
            caption=f"files hashed: {data.get('files_hashed', 0)} of {data['files']}",
        ),
        Panel("\n".join(lines), title="summary"),
    ]
    if data.get("answer"):
        parts.append(Panel(data["answer"], title="parent's answer"))
    return Group(*parts)


def sandbox_line(task: dict[str, Any]) -> str:
    """What the sandboxed child met, and what its sandbox was made of."""
    entry = task.get("sandbox") or {}
    if entry.get("filesystem"):
        held = [f"Landlock ABI {entry.get('landlock_abi')}"]
        held += [name for name in ("seccomp",) if entry.get(name)]
        held.append(str(entry.get("account", "")))
        how = ", ".join(part for part in held if part)
    else:
        missing = entry.get("missing") or {}
        how = "not confined here: " + (
            "; ".join(missing.values()) if missing else str(entry.get("reason", "no sandbox"))
        )
    return (
        f"sandbox: {task['task_id']} (snooper): {task.get('content') or task.get('error')} ({how})"
    )


def console(plain: bool) -> Console:
    if plain:
        return Console(force_terminal=False, no_color=True, width=WIDER, highlight=False)
    return Console(highlight=False)
