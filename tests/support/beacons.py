"""The test's end of the children's beacons (``support.children.beacon`` and ``announce``).

A test waits on what its children did instead of sleeping: ``until(*labels)`` for announced
labels, ``next()`` for the next report of any shape. Every wait is bounded by a hang guard.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

#: hang guard for one wait (a fresh Ray worker starts in a second or two here)
HANG_GUARD = 60.0


def bound_socket(path: str) -> socket.socket:
    """A non-blocking Unix datagram socket bound at ``path``: the test's end of the beacons
    its children send (the caller closes it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Beacons:
    """A datagram socket bound at ``path``; ``seen`` maps each announced label to its pid."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = bound_socket(path)
        self.seen: dict[str, int] = {}

    async def next(self) -> dict[str, Any]:
        """The next report, whatever its shape."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(HANG_GUARD):
            return self._take(await loop.sock_recv(self.sock, 65536))

    async def until(self, *labels: str) -> dict[str, int]:
        """Wait until every label was announced; return label -> pid."""
        while not all(label in self.seen for label in labels):
            await self.next()
        return {label: self.seen[label] for label in labels}

    def drain(self) -> dict[str, int]:
        """Every label announced so far, without waiting."""
        while True:
            try:
                self._take(self.sock.recv(65536))
            except BlockingIOError:
                return dict(self.seen)

    def _take(self, datagram: bytes) -> dict[str, Any]:
        payload: dict[str, Any] = json.loads(datagram)
        if "label" in payload and "pid" in payload:
            self.seen[payload["label"]] = payload["pid"]
        return payload

    def close(self) -> None:
        self.sock.close()
