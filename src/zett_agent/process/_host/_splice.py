"""Relaying a proxied connection's bytes in the kernel, from a thread of its own: ``splice(2)``.

Once the egress proxy (``_proxy``) allowed a connection and reached its upstream, nothing about
its bytes needs Python or the event loop: the pair of sockets goes to the ``Splicer``. Each
direction moves socket -> pipe -> socket with ``splice`` (the bytes never enter user space), in
one thread for every connection of the process, which waits on ``epoll`` and does at most a few
moves per connection per wake-up (fair under a flood). The event loop only hands pairs over and
hears back once per connection, when it ended: however many jobs transfer at once, the loop's
own work never waits behind a relay.

- a direction whose source ends passes the end on (``shutdown(SHUT_WR)``) once its pipe is
  empty; the upstream ending ends the pair (what an HTTP client expects of a proxy);
- every byte counts against the task's budget (``Budget.take``) before it moves: past it, the
  bytes allowed go out and the pair is cut;
- an error on either socket (reset, broken pipe) ends the pair; ``drop`` ends it at once (the
  job ended);
- a direction that moved 4 MiB grows its pipe from 256 KiB to 1 MiB, while fewer than 16 do
  (a pipe's size counts against the account's pipe limit).

The thread starts with the first pair and ends once it has none left.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Budget", "Pair", "Splicer", "splicer"]

#: bytes one splice moves at most, and what each direction's pipe holds, at first
_CHUNK = 256 * 1024
#: a direction that moved ``_BULK_AFTER`` bytes (a bulk transfer) grows its pipe, and its
#: splices, to ``_BULK_CHUNK``: a quarter of the moves and wake-ups (a 100 MB download through
#: the proxy went from 0.81-0.95 of a direct one's speed to 0.88-1.18)
_BULK_AFTER = 4 * 1024 * 1024
_BULK_CHUNK = 1024 * 1024
#: grown pipes at once in the process. A pipe's size counts against its account's pipe limit
#: (``/proc/sys/fs/pipe-user-pages-soft``, 64 MiB by default, not for root), past which every
#: new pipe of the account (the host's own included) gets two pages: with 16 grown, 104
#: connections' pipes still fit (128 with none)
_BULK_PIPES = 16
#: moves per direction per wake-up (then the other connections get their turn)
_MOVES = 4
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
#: errors that end a pair (anything else from a socket is as fatal to it)
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)


class Budget(Protocol):
    def take(self, count: int) -> int:
        """How many of ``count`` bytes may still move; counts them. Thread-safe."""


@dataclass(eq=False)
class _Way:
    """One direction: ``src`` -> pipe -> ``dst``, after ``pending`` (bytes the loop had)."""

    src: int
    dst: int
    pending: memoryview
    read_end: int = -1
    write_end: int = -1
    held: int = 0  # bytes in the pipe that are to go out
    chunk: int = _CHUNK  # what one splice moves at most (the pipe's size)
    moved: int = 0  # bytes taken from src so far
    ended: bool = False  # src gave its end
    passed: bool = False  # the end went on to dst
    cut: bool = False  # past the budget: what is held goes out, then the pair is cut

    @property
    def grown(self) -> bool:
        """Its pipe grew to ``_BULK_CHUNK`` (it holds one of ``_BULK_PIPES``)."""
        return self.chunk != _CHUNK

    def open_pipe(self) -> None:
        self.read_end, self.write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.write_end, _F_SETPIPE_SZ, _CHUNK)


@dataclass(eq=False)
class Pair:
    """A job's connection (``client``) and its upstream, both sockets' descriptors owned here.

    ``on_end(count, cut)`` runs in ``loop`` once the pair ended: the bytes it moved, and
    whether it was cut for the budget.
    """

    client: int
    upstream: int
    budget: Budget
    loop: asyncio.AbstractEventLoop
    on_end: Callable[[int, bool], object]
    first_up: bytes = b""
    first_down: bytes = b""
    count: int = 0
    up: _Way = field(init=False)
    down: _Way = field(init=False)
    done: bool = False

    def __post_init__(self) -> None:
        self.up = _Way(self.client, self.upstream, memoryview(self.first_up))
        self.down = _Way(self.upstream, self.client, memoryview(self.first_down))


class Splicer:
    """The relay thread of the process and the pairs it serves."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._added: list[Pair] = []
        self._dropped: list[Pair] = []
        self._thread: threading.Thread | None = None
        self._wake = -1
        self._pairs: dict[int, Pair] = {}  # by each of its two sockets
        self._grown = 0  # ways whose pipe grew (in the thread only)
        self._epoll: select.epoll | None = None

    def forget(self) -> None:
        """In a child forked from this process: no thread serves the copies; close them."""
        for pair in {*self._added, *self._pairs.values()}:
            self._close(pair)
        if self._wake >= 0:
            with contextlib.suppress(OSError):
                os.close(self._wake)
        if self._epoll is not None:
            self._epoll.close()
        self._reset()

    def add(self, pair: Pair) -> None:
        """Serve ``pair`` from now on.

        ``RuntimeError`` if no thread can start (at exit), ``OSError`` if no pipe can be made;
        either way the pair's descriptors are closed.
        """
        try:
            for way in (pair.up, pair.down):
                way.open_pipe()
        except OSError:
            self._close(pair)
            raise
        with self._lock:
            self._added.append(pair)
            if self._thread is not None:
                os.eventfd_write(self._wake, 1)
                return
            self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            thread = threading.Thread(target=self._run, name="zett-agent-egress", daemon=True)
            self._thread = thread
            try:
                thread.start()
            except RuntimeError:
                self._thread = None
                self._added.remove(pair)
                os.close(self._wake)
                self._close(pair)
                raise

    def drop(self, pair: Pair) -> None:
        """End ``pair`` at once (its ``on_end`` still runs)."""
        with self._lock:
            if self._thread is None:
                return
            self._dropped.append(pair)
            os.eventfd_write(self._wake, 1)

    # -- in the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        epoll = self._epoll = select.epoll()
        epoll.register(self._wake, select.EPOLLIN)
        busy: list[Pair] = []  # pairs that had more to move when their turn ended
        try:
            while True:
                if not self._take_orders(busy):
                    return
                events = epoll.poll(0 if busy else -1)
                turn, busy = [*busy, *(self._pairs.get(fd) for fd, _mask in events)], []
                if any(fd == self._wake for fd, _mask in events):
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                for pair in dict.fromkeys(turn):
                    if pair is not None and not pair.done and self._pump(pair):
                        busy.append(pair)
        finally:
            epoll.close()
            if self._epoll is epoll:
                self._epoll = None

    def _take_orders(self, busy: list[Pair]) -> bool:
        """Take added and dropped pairs; False (and the thread ends) once none is left."""
        with self._lock:
            added, self._added = self._added, []
            dropped, self._dropped = self._dropped, []
        assert self._epoll is not None
        # edge-triggered: a pair is pumped until each way waits on a socket or a pipe
        # (EAGAIN, whose end brings an edge) or used its turn (then it is in ``busy``)
        mask = select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP | select.EPOLLET
        for pair in added:
            self._pairs[pair.client] = self._pairs[pair.upstream] = pair
            self._epoll.register(pair.client, mask)
            self._epoll.register(pair.upstream, mask)
            busy.append(pair)
        for pair in dropped:
            self._end(pair)
        with self._lock:
            if self._pairs or self._added:
                return True
            os.close(self._wake)
            self._wake = -1
            self._thread = None
            return False

    def _pump(self, pair: Pair) -> bool:
        """Move what ``pair`` can now; whether it has more (its turn ended first)."""
        try:
            more = self._move(pair, pair.up) | self._move(pair, pair.down)
        except OSError:
            self._end(pair)
            return False
        up, down = pair.up, pair.down
        if down.passed or (down.cut and not down.held) or (up.cut and not up.held):
            self._end(pair)
            return False
        return more

    def _move(self, pair: Pair, way: _Way) -> bool:
        """Move what ``way`` can without waiting; whether it used its ``_MOVES`` first."""
        while way.pending:
            try:
                sent = os.write(way.dst, way.pending)
            except OSError as exc:
                if exc.errno in _AGAIN:
                    return False
                raise
            way.pending = way.pending[sent:]
        for _ in range(_MOVES):
            if way.held:
                try:
                    moved = os.splice(way.read_end, way.dst, way.held, flags=_FLAGS)
                except OSError as exc:
                    if exc.errno in _AGAIN:
                        return False
                    raise
                way.held -= moved
                if way.held:
                    continue  # a partial write: the next one says whether it would block
            if way.cut:
                return False
            if way.ended:
                if not way.passed:
                    way.passed = True
                    _shut_write(way.dst)
                return False
            try:
                got = os.splice(way.src, way.write_end, way.chunk, flags=_FLAGS)
            except OSError as exc:
                if exc.errno in _AGAIN:
                    return False
                raise
            if got == 0:
                way.ended = True
                continue
            allowed = pair.budget.take(got)
            pair.count += allowed
            way.held = allowed
            way.cut = allowed < got
            if way.moved < _BULK_AFTER <= way.moved + got:
                self._grow(way)
            way.moved += got
        return True

    def _grow(self, way: _Way) -> None:
        """Give a bulk transfer's direction a pipe of ``_BULK_CHUNK`` (asked once).

        Only while fewer than ``_BULK_PIPES`` ways hold one; else, or refused (the account's
        limit), the way keeps its pipe.
        """
        if self._grown >= _BULK_PIPES:
            return
        try:
            fcntl.fcntl(way.write_end, _F_SETPIPE_SZ, _BULK_CHUNK)
        except OSError:
            return
        way.chunk = _BULK_CHUNK
        self._grown += 1

    def _end(self, pair: Pair) -> None:
        if pair.done:
            return
        pair.done = True
        for fd in (pair.client, pair.upstream):
            if self._pairs.pop(fd, None) is not None and self._epoll is not None:
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
        cut = pair.up.cut or pair.down.cut
        self._grown -= pair.up.grown + pair.down.grown
        self._close(pair)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            pair.loop.call_soon_threadsafe(pair.on_end, pair.count, cut)

    @staticmethod
    def _close(pair: Pair) -> None:
        for fd in (pair.client, pair.upstream, pair.up.read_end, pair.up.write_end,
                   pair.down.read_end, pair.down.write_end):  # fmt: skip
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _shut_write(fd: int) -> None:
    """``shutdown(fd, SHUT_WR)``, quietly (the peer may be gone)."""
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.detach()


splicer = Splicer()
os.register_at_fork(after_in_child=splicer.forget)
