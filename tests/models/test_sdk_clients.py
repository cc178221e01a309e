"""A model's SDK clients: one per event loop and configuration, reused, and closed with either."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import ssl
import threading
from typing import Any

import pytest

from support.openai_chunks import HELLO, TEXT_STREAM
from support.openai_loopback import LoopbackServer, Reply, collect
from zett_agent.models import _sdk_http
from zett_agent.models._sdk_clients import CALLS_PER_CLIENT, LoopClients
from zett_agent.models.openai import OpenAIChatModel

HANG_GUARD = 30.0


class FakeClient:
    """Stands for an SDK client: counts how often it is closed."""

    made = 0

    def __init__(self, name: str = "") -> None:
        FakeClient.made += 1
        self.name = name
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


async def test_one_client_per_configuration_on_a_loop() -> None:
    clients = LoopClients()
    first = await clients.get(("a", 1.0), FakeClient)
    assert await clients.get(("a", 1.0), FakeClient) is first
    other = await clients.get(("b", 1.0), FakeClient)
    assert other is not first
    assert clients.count() == 2
    await clients.aclose()
    assert (first.closed, other.closed) == (1, 1)
    assert clients.count() == 0
    await clients.aclose()  # idempotent
    assert first.closed == 1
    again = await clients.get(("a", 1.0), FakeClient)  # still usable: a new client
    assert again is not first
    await clients.aclose()


def test_a_client_is_never_shared_across_loops_and_closes_with_its_loop() -> None:
    clients = LoopClients()
    seen: list[FakeClient] = []

    async def use() -> None:
        seen.append(await clients.get("config", FakeClient))

    asyncio.run(use())
    assert seen[0].closed == 1  # the loop's shutdown closed it
    asyncio.run(use())
    assert seen[1] is not seen[0]
    assert seen[1].closed == 1


async def test_a_dropped_models_clients_close_by_the_next_call_on_the_loop() -> None:
    clients = LoopClients()
    dropped = await clients.get("config", FakeClient)
    del clients
    gc.collect()
    assert dropped.closed == 0  # not in a task a loop's shutdown could cancel halfway
    keeper = LoopClients()
    await keeper.get("config", FakeClient)
    assert dropped.closed == 1
    await keeper.aclose()


def test_a_dropped_models_clients_close_when_the_loop_shuts_down() -> None:
    held: list[FakeClient] = []

    async def use() -> None:
        clients = LoopClients()
        held.append(await clients.get("config", FakeClient))
        del clients
        gc.collect()

    asyncio.run(use())
    assert held[0].closed == 1


async def test_a_pickled_copy_holds_no_client() -> None:
    clients = LoopClients()
    first = await clients.get("config", FakeClient)
    copy = pickle.loads(pickle.dumps(clients))
    assert copy.count() == 0
    assert await copy.get("config", FakeClient) is not first
    await copy.aclose()
    await clients.aclose()


async def test_a_forked_child_builds_its_own_client_and_never_closes_the_parents() -> None:
    clients = LoopClients()
    parents = await clients.get("config", FakeClient)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running anything of the parent's
        code = 1
        try:

            async def child() -> bool:
                mine = await clients.get("config", FakeClient)
                await clients.aclose()
                return mine is not parents and mine.closed == 1 and parents.closed == 0

            code = 0 if asyncio.run(child()) and parents.closed == 0 else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    try:
        answer = await asyncio.wait_for(asyncio.to_thread(os.read, read, 1), HANG_GUARD)
    finally:
        os.close(read)
        await asyncio.to_thread(os.waitpid, pid, 0)
    assert answer == b"\x00"
    assert parents.closed == 0
    await clients.aclose()
    assert parents.closed == 1


async def test_a_model_reuses_its_client_across_calls_and_aclose_closes_it() -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM), Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("m", base_url=server.url, timeout=HANG_GUARD)
        await collect(model.stream(HELLO))
        client = await model._clients.get(model._client_config(), _unexpected)
        await collect(model.stream(HELLO))
        assert await model._clients.get(model._client_config(), _unexpected) is client
        assert model._clients.count() == 1
        assert len(server.requests) == 2
        await model.aclose()
        assert model._clients.count() == 0
        assert client.sdk.is_closed()


async def test_a_changed_base_url_gets_a_client_of_its_own() -> None:
    async with (
        LoopbackServer([Reply(chunks=TEXT_STREAM)]) as one,
        LoopbackServer([Reply(chunks=TEXT_STREAM)]) as two,
    ):
        model = OpenAIChatModel("m", base_url=one.url, timeout=HANG_GUARD)
        await collect(model.stream(HELLO))
        model.base_url = two.url
        await collect(model.stream(HELLO))
        assert (len(one.requests), len(two.requests)) == (1, 1)
        assert model._clients.count() == 2
        await model.aclose()


def _unexpected() -> FakeClient:
    raise AssertionError("the model built a second client for the same configuration")


async def test_the_tls_context_and_the_first_http_client_are_built_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loading the CA bundle, and the HTTP library's first client (it imports its transport),
    take tens of milliseconds each: a first call does both in a thread."""
    monkeypatch.setattr(_sdk_http, "_context", None)
    monkeypatch.setattr(_sdk_http, "_ready", set())
    built_in: dict[str, list[int]] = {"tls": [], "client": []}
    real_context, real_client = _sdk_http.tls_context, _sdk_http.http_client

    def context() -> ssl.SSLContext:
        built_in["tls"].append(threading.get_ident())
        return real_context()

    def client(*args: Any, **kwargs: Any) -> Any:
        built_in["client"].append(threading.get_ident())
        return real_client(*args, **kwargs)

    monkeypatch.setattr(_sdk_http, "tls_context", context)
    monkeypatch.setattr(_sdk_http, "http_client", client)
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("m", base_url=server.url, timeout=HANG_GUARD)
        await collect(model.stream(HELLO))
        await model.aclose()
    loop_thread = threading.get_ident()
    assert built_in["tls"] and built_in["tls"][0] != loop_thread
    assert built_in["client"] and built_in["client"][0] != loop_thread
    assert built_in["client"][1:] == [loop_thread]  # the call's own client, on its loop


async def test_a_lease_shares_a_client_among_at_most_calls_per_client_calls() -> None:
    clients = LoopClients()
    leases = [clients.lease("config", FakeClient) for _ in range(2 * CALLS_PER_CLIENT + 1)]
    held = [await lease.__aenter__() for lease in leases]
    first, second, third = held[0], held[CALLS_PER_CLIENT], held[-1]
    assert held[:CALLS_PER_CLIENT] == [first] * CALLS_PER_CLIENT
    assert held[CALLS_PER_CLIENT:-1] == [second] * CALLS_PER_CLIENT
    assert len({id(first), id(second), id(third)}) == 3
    assert await clients.get("config", FakeClient) is first  # the first client is the get's
    assert clients.count() == 3
    await leases[-1].__aexit__(None, None, None)  # the third's last call: it is closed
    assert clients.count() == 2
    assert await clients.get("config", FakeClient) is first
    assert third.closed == 1
    await leases[0].__aexit__(None, None, None)  # a place on the first: the next call takes it
    async with clients.lease("config", FakeClient) as again:
        assert again is first
    for lease in leases[1:-1]:
        await lease.__aexit__(None, None, None)
    assert clients.count() == 1  # the first client stays, with its idle connections
    await clients.get("config", FakeClient)
    assert (first.closed, second.closed) == (0, 1)
    await clients.aclose()
    assert first.closed == 1


async def test_a_lease_ending_after_aclose_leaves_the_new_clients_alone() -> None:
    clients = LoopClients()
    lease = clients.lease("config", FakeClient)
    old = await lease.__aenter__()
    await clients.aclose()
    assert old.closed == 1
    new = await clients.get("config", FakeClient)
    await lease.__aexit__(None, None, None)
    async with clients.lease("config", FakeClient) as again:
        assert again is new
    assert new.closed == 0
    await clients.aclose()
    assert new.closed == 1
