"""Read-only file tools for the ``explore`` profile: they read, list and search, never write.

Every path is resolved (symlinks included) and must stay inside the root directory; anything
else is refused with an error that tells the model which root it may use.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from zett_agent.tools import AgentTool, ToolResult

MAX_READ_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_RESULTS = 200
MAX_FILE_BYTES = 5 * 1024 * 1024


class _Root:
    """A root directory resolved lazily, so a profile built in the parent resolves in the child."""

    def __init__(self, root: str | None) -> None:
        self._root = root

    def path(self) -> Path:
        return Path(self._root if self._root is not None else os.getcwd()).resolve()

    def resolve(self, relative: str) -> Path:
        root = self.path()
        candidate = (root / relative).resolve()
        if candidate != root and not candidate.is_relative_to(root):
            raise PermissionError(
                f"{relative!r} is outside the root directory {str(root)!r}; "
                "use a path relative to the root, without '..' or symlinks leading out"
            )
        return candidate

    def show(self, path: Path) -> str:
        rel = path.relative_to(self.path())
        return str(rel) if str(rel) != "." else "."


def _iter_files(root: _Root, base: Path, pattern: str) -> list[Path]:
    top = root.path()
    found: list[Path] = []
    for path in sorted(base.glob(pattern)):
        if any(part.startswith(".") for part in path.relative_to(top).parts):
            continue  # hidden files and folders (.git, .venv) are noise for exploration
        if path.is_file() and path.resolve().is_relative_to(top):
            found.append(path)
    return found


def read_only_file_tools(root: str | None = None) -> tuple[AgentTool, ...]:
    """Build ``read_file``, ``list_files`` and ``grep`` confined to ``root`` (default: cwd)."""
    base = _Root(root)

    def read_file(path: str, start_line: int = 1, end_line: int | None = None) -> ToolResult:
        target = base.resolve(path)
        if not target.is_file():
            return ToolResult.error(f"{path!r} is not a file under the root; list_files shows them")
        if target.stat().st_size > MAX_FILE_BYTES:
            return ToolResult.error(
                f"{path!r} is larger than {MAX_FILE_BYTES} bytes; use grep to find the lines"
            )
        lines = target.read_text(errors="replace").splitlines()
        last = len(lines) if end_line is None else min(end_line, len(lines))
        if start_line < 1 or last < start_line - 1:
            return ToolResult.error(
                f"line range {start_line}..{end_line} is invalid for {path!r} "
                f"({len(lines)} lines); start_line starts at 1 and end_line >= start_line"
            )
        last = min(last, start_line - 1 + MAX_READ_LINES)
        body = "\n".join(
            f"{n:>6}  {line[:MAX_LINE_CHARS]}"
            for n, line in enumerate(lines[start_line - 1 : last], start_line)
        )
        return ToolResult(f"{base.show(target)} lines {start_line}-{last} of {len(lines)}\n{body}")

    def list_files(pattern: str = "**/*", path: str = ".") -> ToolResult:
        folder = base.resolve(path)
        files = _iter_files(base, folder, pattern)
        shown = [base.show(f) for f in files[:MAX_RESULTS]]
        more = f"\n... {len(files) - MAX_RESULTS} more" if len(files) > MAX_RESULTS else ""
        return ToolResult("\n".join(shown) + more if shown else "no files match")

    def grep(pattern: str, path: str = ".", glob: str = "**/*") -> ToolResult:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            return ToolResult.error(f"invalid regular expression {pattern!r}: {exc}")
        hits: list[str] = []
        for file in _iter_files(base, base.resolve(path), glob):
            if file.stat().st_size > MAX_FILE_BYTES:
                continue
            try:
                text = file.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    hits.append(f"{base.show(file)}:{n}: {line.strip()[:MAX_LINE_CHARS]}")
                    if len(hits) >= MAX_RESULTS:
                        return ToolResult("\n".join(hits) + f"\n... stopped at {MAX_RESULTS}")
        return ToolResult("\n".join(hits) if hits else "no matches")

    def schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    rel_path = {"type": "string", "description": "path relative to the root directory"}
    return (
        AgentTool(
            name="read_file",
            description="Read a text file, optionally a range of lines (numbered from 1).",
            parameters=schema(
                {
                    "path": rel_path,
                    "start_line": {"type": "integer", "minimum": 1},
                    "end_line": {"type": ["integer", "null"], "minimum": 1},
                },
                ["path"],
            ),
            handler=read_file,
            guidelines="Read only the line ranges you need; grep first to find them.",
        ),
        AgentTool(
            name="list_files",
            description="List files under a folder matching a glob pattern such as '**/*.py'.",
            parameters=schema(
                {"pattern": {"type": "string"}, "path": rel_path},
                [],
            ),
            handler=list_files,
        ),
        AgentTool(
            name="grep",
            description="Search files for a regular expression; returns path:line: text.",
            parameters=schema(
                {"pattern": {"type": "string"}, "path": rel_path, "glob": {"type": "string"}},
                ["pattern"],
            ),
            handler=grep,
        ),
    )
