"""The demo's terminal view (rich): a live task table and a closing summary."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from zett_agent.extensions.async_subagent import AsyncSubAgentExtension

_STYLE = {
    "pending": "dim",
    "running": "cyan",
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
}


def _mib(value: Any) -> str:
    return f"{value / 2**20:.0f} MiB" if value else "-"


def task_table(infos: list[dict[str, Any]], title: str = "background tasks") -> Table:
    table = Table(title=title, expand=True)
    headers = ("task", "type", "status", "pid", "CPU s", "mem", "turns", "last tool", "time")
    for column in headers:
        table.add_column(column, no_wrap=True)
    table.add_column("result", no_wrap=True, overflow="ellipsis", min_width=20, ratio=1)
    for info in infos:
        status = str(info.get("status", ""))
        detail = str(info.get("content") or info.get("error") or info.get("description", ""))
        table.add_row(
            str(info.get("task_id")),
            str(info.get("subagent_type")),
            Text(status, style=_STYLE.get(status, "")),
            str(info.get("pid") or "-"),
            f"{info.get('cpu_seconds', 0):.2f}",
            _mib(info.get("peak_memory_bytes")),
            str(info.get("turns", 0)),
            str(info.get("last_tool") or "-"),
            f"{info.get('elapsed_seconds', 0):.1f}s",
            detail[:80],
        )
    return table


def live_table(extension: AsyncSubAgentExtension, session: str) -> Table:
    return task_table([dict(extension.task_info(t)) for t in extension.tasks(session)])


def summary(data: dict[str, Any]) -> Group:
    cancel = data.get("cancel_seconds")
    lines = [
        f"wall time {data['wall_seconds']:.2f} s; children CPU time "
        f"{data['children_cpu_seconds']:.2f} s on {data['cpu_count']} cores: "
        f"parallel speedup x{data['parallel_speedup']}",
        "hard cancel: the spinner's process tree was killed and confirmed gone in "
        + (f"{cancel * 1000:.1f} ms" if cancel is not None else "(not cancelled)"),
    ]
    lines.append(
        f"the parent kept working meanwhile (survey: {'; '.join(data['parent_work']) or '-'}); "
        f"its event loop never stalled more than {data['parent_loop_max_stall_ms']:.1f} ms"
    )
    failed = [t for t in data["tasks"] if t["status"] == "failed"]
    for task in failed:
        lines.append(
            f"clean failure: {task['task_id']} ({task['subagent_type']}): {task.get('error')}"
        )
    return Group(
        task_table(data["tasks"], title="final"),
        Panel("\n".join(lines), title="summary"),
        Panel(data["answer"], title="parent's answer"),
    )


def console(plain: bool) -> Console:
    return Console(
        force_terminal=False if plain else None, no_color=plain, width=160 if plain else None
    )
