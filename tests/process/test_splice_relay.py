"""The egress relay thread (``_host/_splice``) on its own: connected loopback sockets of this
process, no sandbox. What it promises beyond moving bytes: a bulk transfer's pipe grows, and
never more of them at once than ``_BULK_PIPES``, whose pages count against the account's pipe
limit shared by every pipe of the host."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import threading
from collections.abc import Iterator

import pytest

from support.jobs import until
from zett_agent.process._host import _splice

#: the pipes here are few and small: the mechanism, not the production sizes
_AFTER = 64 * 1024
_PIPES = 3
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class _Everything:
    """A budget that lets everything through."""

    def take(self, count: int) -> int:
        return count


def _connected() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return near, far


class _Route:
    """A server end -> (upstream | relay | client) -> a reader end draining it in a thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.server, upstream = _connected()
        client, self.reader = _connected()
        for relayed in (upstream, client):  # as the proxy's: the relay never waits on one
            relayed.setblocking(False)
        self.received = 0
        self.ended = asyncio.Event()
        self.pair = _splice.Pair(
            client.detach(), upstream.detach(), _Everything(), loop, self._on_end
        )
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _on_end(self, count: int, cut: bool) -> None:
        self.ended.set()

    def _read(self) -> None:
        while chunk := self.reader.recv(1 << 16):
            self.received += len(chunk)

    def close(self) -> None:
        self.server.close()
        self._drain.join(30)
        self.reader.close()


@pytest.fixture
def small_bulk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_splice, "_BULK_AFTER", _AFTER)
    monkeypatch.setattr(_splice, "_BULK_PIPES", _PIPES)
    yield


@pytest.mark.usefixtures("small_bulk")
async def test_bulk_transfers_grow_their_pipes_but_never_more_than_the_bound() -> None:
    loop = asyncio.get_running_loop()
    routes = [_Route(loop) for _ in range(_PIPES + 2)]
    try:
        for route in routes:
            _splice.splicer.add(route.pair)
        size = 4 * _AFTER
        for route in routes:
            route.server.sendall(b"x" * size)  # each held open after: its pair goes on
        await until(lambda: all(r.received == size for r in routes), what="every byte relayed")
        grown = [r.pair.down for r in routes if r.pair.down.grown]
        assert len(grown) == _PIPES == _splice.splicer._grown
        for way in grown:
            assert fcntl.fcntl(way.write_end, _F_GETPIPE_SZ) == _splice._BULK_CHUNK
            assert way.chunk == _splice._BULK_CHUNK
        # the other direction moved nothing: no bulk, no growth
        assert not any(r.pair.up.grown for r in routes)
    finally:
        for route in routes:
            route.close()  # the upstream's end ends each pair
        async with asyncio.timeout(30):
            for route in routes:
                await route.ended.wait()
    assert _splice.splicer._grown == 0  # each ended pair gave its pipes back
