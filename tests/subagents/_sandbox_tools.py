"""A tool that tries to read a file and says what it met; children import it by reference."""

from __future__ import annotations

import os

from zett_agent.tools import AgentTool


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return f"read {len(handle.read())} characters as uid {os.getuid()}"
    except OSError as exc:
        return f"denied: {exc.strerror} as uid {os.getuid()}"


READ = AgentTool(
    "read_path",
    "Read a file.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    _read,
)
