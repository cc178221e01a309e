"""The pace of model streams on one event loop: a budget of work per loop turn, shared by all.

When many model calls stream at once (a parent brokering 1,000 children, their endpoint answering
all of them together), every call has something to read in the same loop iteration, and asyncio
runs every ready callback before it looks at its timers: at 0.1 to 0.4 ms of the parent's CPU per
relayed event, one iteration took 0.3 s and more, and nothing else of the parent ran meanwhile.
So a call asks ``pace()`` before each piece of work its stream makes: the connection's read as
soon as it returns data, before the HTTP library parses it (``_paced_reads``), the HTTP
client's response hook before the SDK takes the response's head (``_budget``), the budget's
byte stream before it hands the SDK each piece of the body it read, and the broker before it
reads its next event.
Within the current turn's budget (``TURN_SECONDS``) a call goes on at once; once the budget is
spent it waits, in order of arrival, and each later loop iteration lets the next ``PER_TURN``
waiting calls go on, each with a fresh budget for that turn. The loop's timers and other
callbacks run between turns.

A call alone (or a few, with events farther apart than the budget) never waits. Waiting delays a
call's next step, never reorders or drops its events (each call relays its own events in
order); a call cancelled while it waits leaves its place to the next.
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref

__all__ = ["PER_TURN", "TURN_SECONDS", "pace"]

#: the work one loop turn may do before the calls that come next wait for a later turn: short,
#: since a turn the scheduler interrupts is a stall of the loop as long as the interruption, and
#: each call that goes on does one step past it (a quarter of a millisecond: 1,000 brokered
#: children streaming through one parent at nice 10 stalled its loop 2.2 to 4.5 ms at p99 in
#: six runs, 2.6 to 6.8 with half a millisecond and two calls per turn, in the same time)
TURN_SECONDS = 0.00025
#: the waiting calls a later turn lets go on (each does at least one step, whatever the budget)
PER_TURN = 1


class _Pacer:
    """The turns of one event loop (see the module docstring)."""

    __slots__ = ("armed", "loop", "turn_end", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.turn_end = 0.0
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self.armed = False

    async def turn(self) -> None:
        now = time.perf_counter()
        if now < self.turn_end:
            return
        if not self.waiting and not self.armed and now >= self.turn_end + TURN_SECONDS:
            # the last turn ended a budget ago, so the loop is not busy with relaying: a new
            # turn starts here (a call alone never waits)
            self.turn_end = now + TURN_SECONDS
            return
        waiter: asyncio.Future[None] = self.loop.create_future()
        self.waiting.append(waiter)
        if not self.armed:
            self.armed = True
            # a timer, not ``call_soon``: due timers (a ticker's, a deadline's) that came due
            # before it run first, in the next iteration
            self.loop.call_later(0, self._next_turn)
        await waiter

    def _next_turn(self) -> None:
        self.armed = False
        self.turn_end = time.perf_counter() + TURN_SECONDS
        woken = 0
        while self.waiting and woken < PER_TURN:
            waiter = self.waiting.popleft()
            if not waiter.done():  # a cancelled call is skipped
                waiter.set_result(None)
                woken += 1
        if self.waiting:
            self.armed = True
            self.loop.call_later(0, self._next_turn)


_pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pacer] = weakref.WeakKeyDictionary()


async def pace() -> None:
    """Wait, when the running loop's relaying budget for this turn is spent, for a later turn."""
    loop = asyncio.get_running_loop()
    pacer = _pacers.get(loop)
    if pacer is None:
        pacer = _pacers[loop] = _Pacer(loop)
    await pacer.turn()
