"""Model streams take turns on a busy loop: a budget of work per turn, in arrival order."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncIterator

import httpx
import pytest

from zett_agent.models import _paced_reads, _pacing
from zett_agent.models._budget import guard
from zett_agent.models._pacing import PER_TURN, TURN_SECONDS, pace
from zett_agent.models._sdk_http import http_client

HANG_GUARD = 30.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pacer's clock, moved by the test only."""
    now = [1000.0]
    monkeypatch.setattr(_pacing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def went_on_at_once(coroutine: object) -> bool:
    """Whether ``coroutine`` (a ``pace()``) finished without suspending."""
    assert isinstance(coroutine, types.CoroutineType)
    try:
        coroutine.send(None)
    except StopIteration:
        return True
    coroutine.close()
    return False


async def test_a_call_alone_never_waits(clock: list[float]) -> None:
    for _ in range(50):
        assert went_on_at_once(pace())  # within the turn's budget
    for _ in range(5):
        clock[0] += 2 * TURN_SECONDS + 1e-6  # events farther apart than the budget
        assert went_on_at_once(pace())


async def test_a_spent_turn_lets_later_calls_go_on_a_few_per_iteration_in_order(
    clock: list[float],
) -> None:
    loop = asyncio.get_running_loop()
    assert went_on_at_once(pace())  # a turn begins
    clock[0] += TURN_SECONDS  # and its budget is spent
    iteration = 0

    def count() -> None:
        nonlocal iteration
        iteration += 1
        loop.call_soon(count)

    count()
    went: list[tuple[int, int]] = []  # (which call, the iteration it went on in)

    async def call(index: int) -> None:
        await pace()
        went.append((index, iteration))

    timer_ran_at: list[int] = []
    loop.call_later(0, lambda: timer_ran_at.append(len(went)))  # due before the next turn
    calls = 3 * PER_TURN + 2
    tasks = [asyncio.ensure_future(call(i)) for i in range(calls)]
    await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD)
    assert [index for index, _ in went] == list(range(calls))  # in the order they came
    per_iteration: dict[int, int] = {}
    for _, at in went:
        per_iteration[at] = per_iteration.get(at, 0) + 1
    assert max(per_iteration.values()) == PER_TURN
    assert len(per_iteration) == -(-calls // PER_TURN)  # as few iterations as that allows
    assert timer_ran_at == [0]  # the timer that came due first ran before any turn


async def test_a_call_cancelled_while_it_waits_leaves_its_place_to_the_next(
    clock: list[float],
) -> None:
    assert went_on_at_once(pace())
    clock[0] += TURN_SECONDS
    went: list[int] = []

    async def call(index: int) -> None:
        await pace()
        went.append(index)

    tasks = [asyncio.ensure_future(call(i)) for i in range(PER_TURN + 1)]
    await asyncio.sleep(0)  # all of them wait now
    assert went == []
    tasks[0].cancel()
    await asyncio.wait_for(asyncio.gather(*tasks[1:]), HANG_GUARD)
    assert went == list(range(1, PER_TURN + 1))
    assert tasks[0].cancelled()


async def test_a_responses_head_and_each_piece_of_its_body_wait_for_their_turn(
    clock: list[float],
) -> None:
    """When a thousand responses arrive at once, what the SDK does with each takes turns too."""
    pieces = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n']

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Body())
    hook = guard(json_as_event=False)
    assert went_on_at_once(pace())  # a turn begins
    clock[0] += TURN_SECONDS  # and its budget is spent
    head = asyncio.ensure_future(hook(response))
    await asyncio.sleep(0)
    assert not head.done()  # the head waits for a later turn
    await asyncio.wait_for(head, HANG_GUARD)
    body = aiter(response.stream)
    for piece in pieces:
        clock[0] += TURN_SECONDS  # the turn that let it go on is spent
        read = asyncio.ensure_future(anext(body))
        await asyncio.sleep(0)
        assert not read.done()  # each piece waits for a later turn before the SDK sees it
        assert await asyncio.wait_for(read, HANG_GUARD) == piece


async def test_what_a_connection_reads_waits_for_its_turn_before_the_http_library_parses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call woken by its socket waits for a turn before the SDK's HTTP library parses what came.

    The turns are held shut here: the server has sent a whole response, and still the client
    has no head of it until they open. (The response hook takes a turn too, after the head is
    parsed; it is left alone here, so what holds the response is the read's own turn.)
    """
    openai = pytest.importorskip("openai")
    gate, read_waits = asyncio.Event(), asyncio.Event()
    waited = 0

    async def shut_turn() -> None:
        nonlocal waited
        waited += 1
        read_waits.set()
        await gate.wait()

    sent = asyncio.Event()
    body = b'data: {"n": 1}\n\n'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        sent.set()
        await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = http_client(openai.DefaultAsyncHttpxClient, timeout=HANG_GUARD, json_as_event=False)
    monkeypatch.setattr(_paced_reads, "pace", shut_turn)
    request = client.build_request("POST", f"http://127.0.0.1:{port}/v1/x", content=b"{}")
    answer = asyncio.ensure_future(client.send(request, stream=True))
    try:
        await asyncio.wait_for(sent.wait(), HANG_GUARD)
        # whichever comes first: the read that brought the response asks for its turn, or the
        # library parses the response without one
        asking = asyncio.ensure_future(read_waits.wait())
        await asyncio.wait({asking, answer}, timeout=HANG_GUARD, return_when="FIRST_COMPLETED")
        asking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asking
        assert read_waits.is_set() and waited == 1  # the read waits for its turn
        assert not answer.done()  # and nothing of the response has been parsed
        gate.set()
        response = await asyncio.wait_for(answer, HANG_GUARD)
        assert response.status_code == 200
        assert await asyncio.wait_for(response.aread(), HANG_GUARD) == body
        await response.aclose()
    finally:
        gate.set()
        if not answer.done():
            answer.cancel()
        with contextlib.suppress(BaseException):
            await (await answer).aclose()
        await client.aclose()
        server.close()
        await server.wait_closed()
