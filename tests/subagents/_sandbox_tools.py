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


def _fetch(url: str) -> str:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return f"fetched {len(response.read())} bytes"
    except urllib.error.HTTPError as exc:
        return f"refused: {exc.code}"
    except OSError as exc:
        return f"failed: {exc}"


FETCH = AgentTool(
    "fetch",
    "Fetch a URL.",
    {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
    _fetch,
)
