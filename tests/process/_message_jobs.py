"""Job functions for the host-to-job message tests (sent to workers by value)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from typing import Any

from zett_agent.process import emit
from zett_agent.process._child._inbox import receive, receive_blocking


async def echo_async(count: int, topic: str = "") -> list[Any]:
    """Say it runs, then return the next ``count`` messages on ``topic``."""
    emit("ready")
    return [await receive(topic) for _ in range(count)]


def echo_sync(count: int, topic: str = "") -> list[Any]:
    emit("ready")
    return [receive_blocking(topic, timeout=30) for _ in range(count)]


def sync_timeout() -> str:
    emit("ready")
    try:
        receive_blocking("never", timeout=0.05)
    except TimeoutError as exc:
        return f"timeout: {exc}"
    return "got one"


async def topics_in_their_order() -> dict[str, list[Any]]:
    """Read topic b first, then a: each topic is its own queue, in the order sent."""
    emit("ready")
    b = [await receive("b") for _ in range(3)]
    a = [await receive("a") for _ in range(3)]
    return {"a": a, "b": b}


async def concurrent_receivers() -> list[Any]:
    """Two receivers wait at once, on two topics; both get theirs."""
    first = asyncio.ensure_future(receive("x"))
    second = asyncio.ensure_future(receive("y"))
    await asyncio.sleep(0)
    emit("ready")
    return [await second, await first]


async def cancelled_receive_loses_nothing() -> list[Any]:
    """A receive cancelled while it waits takes no message; the next one gets it."""
    waiting = asyncio.ensure_future(receive())
    await asyncio.sleep(0)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    emit("ready")
    return [await receive()]


def blocked_until_go(fifo: str) -> int:
    """Never read until the host writes to ``fifo``; then count the bytes of every message
    until one says stop."""
    emit("ready")
    with open(fifo, "rb") as stream:
        stream.readline()
    total = 0
    count = 0
    while True:
        value = receive_blocking(timeout=30)
        if value == "stop":
            return count
        total += len(value)
        count += 1


async def read_one_then_end() -> Any:
    """Take one message and end at once (the host sent more right behind it)."""
    emit("ready")
    return await receive()


def first_message_or_none() -> Any:
    """The first message this job gets (``None`` if none within the guard)."""
    emit("ready")
    try:
        return receive_blocking(timeout=30)
    except TimeoutError:
        return None


async def receive_in_a_thread_and_the_loop() -> list[Any]:
    """A thread blocks on one topic while the loop waits on another."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(receive_blocking("thread", timeout=30)))
    thread.start()
    emit("ready")
    value = await receive("loop")
    await asyncio.to_thread(thread.join)
    return [value, *got]


def receive_under_uvloop() -> Any:
    """A job that runs its own uvloop loop receives through it."""
    import uvloop

    async def inner() -> Any:
        emit("ready")
        return [await receive(), type(asyncio.get_running_loop()).__module__]

    return uvloop.run(inner())


def pid() -> int:
    return os.getpid()


def wait_then_end(fifo: str) -> str:
    """Read no message at all: wait for the host's line on ``fifo``, then end."""
    emit("ready")
    with open(fifo, "rb") as stream:
        return stream.readline().decode().strip()
