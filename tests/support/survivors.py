"""Which processes a hostile child started are still alive, checked by pid and start time so
that a reused pid cannot pass for a survivor.

A child calls ``record(path)`` in every process it starts (one ``pid starttime`` line each);
the test asks ``survivors(path)``.
"""

from __future__ import annotations

import os
from pathlib import Path


def record(path: str) -> None:
    """Append ``pid starttime`` of the calling process to ``path`` (one write: atomic)."""
    with open(f"/proc/{os.getpid()}/stat", "rb") as handle:
        data = handle.read()
    start = data[data.rfind(b")") + 2 :].split()[19].decode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {start}\n".encode())
    finally:
        os.close(fd)


def survivors(path: Path) -> list[tuple[int, str]]:
    """The processes recorded in ``path`` that are still alive: ``(pid, starttime)``."""
    found: list[tuple[int, str]] = []
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        pid, start = int(line.split()[0]), line.split()[1]
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if fields[19].decode() == start and fields[0] not in (b"Z", b"X"):
            found.append((pid, start))
    return found
