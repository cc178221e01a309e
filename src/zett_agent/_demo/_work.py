"""The children's tools.

Real CPU work on real files, a spin that never yields, a crash, and a look at a file outside the
sandbox.

Imported in child processes; keep it light.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from pathlib import Path

from zett_agent.tools import AgentTool

SKIP_DIRS = {".git", ".venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache"}
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Bytes of each file mixed into every hash round.
BLOCK_BYTES = 4096
#: Seconds between two progress reports of a hasher (a tiny --rounds must not flood the parent).
PROGRESS_EVERY = 0.1


def list_files(root: str) -> list[Path]:
    """Every regular file under ``root`` (sorted, hidden tool folders skipped)."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                found.append(path)
    return found


def hash_files(root: str, shard: int, shards: int, rounds: int) -> dict[str, object]:
    """Hash every ``shards``-th file under ``root`` ``rounds`` times over (pure CPU work).

    Reports ``{"kind": "progress", "done": files, "total": files}`` to the parent as it goes
    (at most every ``PROGRESS_EVERY`` seconds, and once at the end).
    """
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard must be in 0..{shards - 1}, got {shard}")
    files = list_files(root)[shard::shards]
    report = _Progress(len(files))
    digest = hashlib.sha256()
    size = 0
    for done, path in enumerate(files, 1):
        try:
            data = path.read_bytes()[:MAX_FILE_BYTES]
        except OSError:
            report(done)
            continue
        size += len(data)
        block = hashlib.sha256(data).digest()
        for _ in range(rounds):
            block = hashlib.sha256(block + data[:BLOCK_BYTES]).digest()
        digest.update(block)
        report(done)
    report(len(files), final=True)
    return {"files": len(files), "bytes": size, "rounds": rounds, "digest": digest.hexdigest()[:16]}


class _Progress:
    """Reports ``done`` of ``total`` files to the parent, at most every ``PROGRESS_EVERY`` s."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.last = time.monotonic()
        self(0, final=True)

    def __call__(self, done: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        from zett_agent.process import emit

        # Outside a worker process (a runner without one) there is nobody to tell.
        with contextlib.suppress(RuntimeError):
            emit({"kind": "progress", "done": done, "total": self.total})


def spin_forever() -> str:
    """Burn CPU in pure Python without ever yielding (only a kill stops it)."""
    n = 0
    while True:
        n += 1


def crash() -> str:
    """Die from a real segmentation fault."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


def read_outside(path: str) -> dict[str, object]:
    """Try to read ``path`` (a file the parent made, outside the sandbox); say what happened."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return {"tried": path, "denied": True, "error": exc.strerror or type(exc).__name__}
    return {"tried": path, "denied": False, "bytes": len(data)}


HASH_TOOL = AgentTool(
    "hash_files",
    "Hash one shard of the files under a folder, many rounds over (CPU-heavy).",
    {
        "type": "object",
        "properties": {
            "root": {"type": "string"},
            "shard": {"type": "integer", "minimum": 0},
            "shards": {"type": "integer", "minimum": 1},
            "rounds": {"type": "integer", "minimum": 1},
        },
        "required": ["root", "shard", "shards", "rounds"],
        "additionalProperties": False,
    },
    hash_files,
    guidelines="Pass the root, shard, shards and rounds from your task exactly.",
)
SPIN_TOOL = AgentTool(
    "spin_forever", "Work forever.", {"type": "object", "properties": {}}, spin_forever
)
CRASH_TOOL = AgentTool("crash", "Crash the process.", {"type": "object", "properties": {}}, crash)
READ_TOOL = AgentTool(
    "read_outside",
    "Read a file.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    read_outside,
)
