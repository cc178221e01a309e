"""Brokered model calls: a child on ``OpenAIChatModel`` whose requests the parent makes.

Real child processes, a real loopback OpenAI-compatible server, the real adapter in the
parent. The child gets a keyless stand-in; these tests look for the key where it must not be
(the child's environment and every readable page of its memory, read from ``/proc`` as root),
break the broker's protocol from inside a child, and kill children mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import _brokered_children as kids
import cloudpickle
import pytest

from support.openai_chunks import TEXT_STREAM, chunk, usage_chunk
from support.openai_endpoint import OfflineEndpoint
from support.openai_loopback import LoopbackServer, Reply, json_reply, sse
from zett_agent._model import ModelRequest, RetryOptions, ToolSpec
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
)
from zett_agent.extensions.subagent import SubAgentDefinition, SubAgentExtension
from zett_agent.messages import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.process import ProcessPool, Sandbox
from zett_agent.runners import ProcessRunner
from zett_agent.runners._broker import _parent as _broker
from zett_agent.runners._broker._standin import BrokeredModel, relaying
from zett_agent.runners._broker._usage import estimated_tokens
from zett_agent.runners._broker._wire import BadRequest, decode_request, encode_request
from zett_agent.testing import FunctionModel, ScriptedModel

cloudpickle.register_pickle_by_value(kids)

HANG_GUARD = 60
FAST_RETRY = RetryOptions(max_retries=2, initial_delay=0.0)


def new_key() -> str:
    return "sk-zett-test-" + secrets.token_hex(20)


def tool_call_stream(name: str, arguments: dict[str, Any], call_id: str = "call-1") -> list[bytes]:
    return sse(
        chunk(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
        ),
        chunk({}, finish="tool_calls"),
        usage_chunk(20, 5),
    )


def parent_step(request: ModelRequest) -> AssistantMessage:
    """Start the task the user's message names, wait for it, answer with its report."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        subagent_type = request.messages[0].content  # type: ignore[union-attr]
        args = {"subagent_type": subagent_type, "description": "work", "prompt": "do the work"}
        return AssistantMessage(tool_calls=(ToolCall("s", "task_start", args),))
    if len(results) == 1:
        args = {"task_id": json.loads(results[0].text)["task_id"], "wait_seconds": HANG_GUARD}
        return AssistantMessage(tool_calls=(ToolCall("o", "task_output", args),))
    return AssistantMessage(results[-1].text)


class CountingServer(LoopbackServer):
    """A ``LoopbackServer`` that counts the clients that hung up while it held them."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(replies)
        self.gone = 0
        self._gone_changed = asyncio.Event()
        #: set once a response is held open (its request arrived and was answered in part)
        self.holding = asyncio.Event()

    async def _until_client_gone(self, reader: asyncio.StreamReader) -> None:
        self.holding.set()
        await super()._until_client_gone(reader)
        self.gone += 1
        self._gone_changed.set()

    async def until_gone(self, count: int) -> None:
        async with asyncio.timeout(HANG_GUARD):
            while self.gone < count:
                self._gone_changed.clear()
                await self._gone_changed.wait()


@contextlib.asynccontextmanager
async def extension_on(
    containment: str, *definitions: SubAgentDefinition, broker: bool = True
) -> AsyncIterator[AsyncSubAgentExtension]:
    async with (
        ProcessPool(4, containment=containment) as pool,
        Recording(list(definitions), runner=ProcessRunner(pool, broker=broker)) as ext,
    ):
        yield ext


async def run_parent(
    extension: AsyncSubAgentExtension, subagent_type: str, session_id: str = "parent"
) -> str:
    """Run a ``parent_step`` parent in ``session_id`` that starts a ``subagent_type`` task and
    answers with its report; return that answer."""
    client = await create_agent(
        FunctionModel(parent_step),
        config=AgentRunConfig(session_id=session_id),
        extensions=[extension],
    )
    async with client, asyncio.timeout(HANG_GUARD):
        return (await client.run(subagent_type)).content


class Recording(AsyncSubAgentExtension):
    """Keeps the tasks it started: closing a client releases its session's entries, and the
    tests look at the tasks afterwards."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[SubAgentTask] = []

    async def task_started(self, task: SubAgentTask) -> None:
        self.started.append(task)


def only_task(extension: AsyncSubAgentExtension) -> SubAgentTask:
    [task] = extension.started if isinstance(extension, Recording) else extension.tasks("parent")
    return task


# -- a brokered child completes through the parent ------------------------------------------------


async def test_a_brokered_child_completes_its_task_through_the_parent(containment: str) -> None:
    key = new_key()
    assert key not in os.environ.values()
    replies = [
        Reply(chunks=tool_call_stream("pid", {}, "call-1")),
        Reply(chunks=tool_call_stream("pid", {}, "call-2")),
        Reply(chunks=TEXT_STREAM),
    ]
    async with LoopbackServer(replies) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, api_key=key, retry=FAST_RETRY)
        definition = SubAgentDefinition(
            "remote", "a brokered child", "You are the child.", model=model, tools=[kids.PID_TOOL]
        )
        async with extension_on(containment, definition) as extension:
            answer = await run_parent(extension, "remote")
            task = only_task(extension)
            info = extension.task_info(task)

    assert json.loads(answer)["content"] == "Hello"
    assert task.status is SubAgentTaskStatus.COMPLETED
    assert (task.turns, task.tool_calls, task.last_tool) == (3, 2, "pid")
    assert (task.input_tokens, task.output_tokens) == (20 + 20 + 12, 5 + 5 + 3)
    assert info["broker"] == {"calls": 3, "refused": 0}
    assert len(server.requests) == 3
    for received in server.requests:  # the parent sent the key; the child never had it
        assert received.headers["authorization"] == f"Bearer {key}"
        assert received.body["model"] == "test-model"
    first, _, third = server.requests
    assert first.body["messages"][:2] == [
        {"role": "system", "content": "You are the child."},
        {"role": "user", "content": "do the work"},
    ]
    assert [t["function"]["name"] for t in first.body["tools"]] == ["pid"]
    tool_answer = third.body["messages"][-1]
    assert tool_answer["role"] == "tool" and tool_answer["tool_call_id"] == "call-2"
    assert json.loads(tool_answer["content"])["pid"] != os.getpid()  # ran in the child


async def test_a_lone_surrogate_in_a_brokered_request_reaches_the_provider_as_u_fffd() -> None:
    """The stand-in sends its request as JSON takes it (unwalked when it fits one frame); a
    text no provider could take still goes as U+FFFD, as the model's own adapter sends it."""
    replies = [Reply(chunks=TEXT_STREAM)]
    async with LoopbackServer(replies) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, retry=FAST_RETRY)
        definition = SubAgentDefinition(
            "remote", "a brokered child", "You are the child \ud800.", model=model
        )
        async with extension_on("auto", definition) as extension:
            answer = await run_parent(extension, "remote")
            task = only_task(extension)

    assert json.loads(answer)["content"] == "Hello"
    assert task.status is SubAgentTaskStatus.COMPLETED
    [received] = server.requests
    assert received.body["messages"][0] == {
        "role": "system",
        "content": "You are the child \ufffd.",
    }


async def test_the_blocking_extension_brokers_too() -> None:
    key = new_key()
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, api_key=key)
        definition = SubAgentDefinition("remote", "a child", "You are the child.", model=model)

        def parent(request: ModelRequest) -> AssistantMessage:
            results = [m for m in request.messages if isinstance(m, ToolMessage)]
            if not results:
                args = {"subagent_type": "remote", "description": "work", "prompt": "go"}
                return AssistantMessage(tool_calls=(ToolCall("s", "subagent", args),))
            return AssistantMessage(results[0].text)

        async with SubAgentExtension([definition], runner=ProcessRunner(broker=True)) as ext:
            client = await create_agent(FunctionModel(parent), extensions=[ext])
            async with client, asyncio.timeout(HANG_GUARD):
                answer = await client.run("go")
    assert answer.content == "Hello"
    assert server.requests[0].headers["authorization"] == f"Bearer {key}"


async def test_models_that_cannot_be_brokered_travel_as_before() -> None:
    definition = SubAgentDefinition(
        "scripted", "a child", "You are the child.", model=ScriptedModel(["scripted report"])
    )
    async with Recording([definition], runner=ProcessRunner(broker=True)) as ext:
        answer = await run_parent(ext, "scripted")
        info = ext.task_info(only_task(ext))
    assert json.loads(answer)["content"] == "scripted report"
    assert "broker" not in info  # nothing to broker: no broker serves this child


# -- the key is not in the child ------------------------------------------------------------------


def _readable_memory(pid: int) -> Iterator[bytes]:
    """Every readable mapping of ``pid``'s memory, in slices (as root, through /proc)."""
    with open(f"/proc/{pid}/maps") as maps:
        regions = [line.split() for line in maps]
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for fields in regions:
            start, end = (int(part, 16) for part in fields[0].split("-"))
            if "r" not in fields[1]:
                continue
            position = start
            while position < end:
                size = min(end - position, 1 << 22)
                try:
                    mem.seek(position)
                    data = mem.read(size)
                except (OSError, OverflowError, ValueError):
                    break  # [vvar] and friends cannot be read; the rest of the region neither
                if not data:
                    break
                yield data
                position += len(data)


def memory_holds(pid: int, needles: list[bytes]) -> dict[bytes, bool]:
    found = dict.fromkeys(needles, False)
    overlap = max(len(n) for n in needles)
    tail = b""
    for data in _readable_memory(pid):
        window = tail + data
        for needle in needles:
            if not found[needle] and needle in window:
                found[needle] = True
        tail = window[-overlap:]
    return found


@pytest.fixture
def fifos(tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    """``(ready, go, go_fd)``: the child writes its pid to ``ready`` and blocks reading
    ``go``; the test holds ``go`` open (so the child's open never blocks) and writes to it."""
    ready, go = str(tmp_path / "ready"), str(tmp_path / "go")
    os.mkfifo(ready)
    os.mkfifo(go)
    keep = os.open(go, os.O_RDWR)
    yield ready, go, keep
    os.close(keep)


def _read_line(path: str) -> str:
    with open(path) as stream:
        return stream.readline().strip()


async def child_waiting(ready: str) -> int:
    """The pid the child's ``wait_here`` tool reports once it blocks mid-task."""
    async with asyncio.timeout(HANG_GUARD):
        return int(await asyncio.to_thread(_read_line, ready))


@contextlib.asynccontextmanager
async def child_held(ready: str, go_fd: int) -> AsyncIterator[int]:
    """The pid of the child blocked in its ``wait_here`` tool (``child_waiting``), held there
    until the block ends, on error too: then the test writes ``go`` and the child goes on."""
    try:
        yield await child_waiting(ready)
    finally:
        os.write(go_fd, b"go\n")


async def environ_and_memory(pid: int, key: str) -> tuple[bytes, dict[bytes, bool]]:
    """The environment of process ``pid``, and whether its memory holds ``key`` and the child's
    system prompt (which it holds for sure: a scan that misses it is broken)."""
    environ = await asyncio.to_thread(Path(f"/proc/{pid}/environ").read_bytes)
    found = await asyncio.to_thread(memory_holds, pid, [key.encode(), b"You are the child."])
    return environ, found


@pytest.mark.parametrize("where", ["definition", "model=None"])
@pytest.mark.parametrize("brokered", [True, False], ids=["brokered", "control-unbrokered"])
async def test_the_key_is_in_neither_the_environment_nor_the_memory_of_the_child(
    containment: str, fifos: tuple[str, str, int], where: str, brokered: bool
) -> None:
    ready, go, go_fd = fifos
    key = new_key()
    assert key not in os.environ.values()
    wait = {"ready": ready, "go": go}

    def answer(request: ModelRequest) -> AssistantMessage:  # behind the endpoint
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if request.system_prompt == "You are the child.":
            if not results:
                return AssistantMessage(tool_calls=(ToolCall("w", "wait_here", wait),))
            return AssistantMessage(f"done: {results[0].text}")
        return parent_step(request)

    async with OfflineEndpoint(answer) as endpoint:
        model = OpenAIChatModel("test-model", base_url=endpoint.url, api_key=key)
        definition = SubAgentDefinition(
            "remote",
            "a child that waits",
            "You are the child.",
            model=model if where == "definition" else None,
            tools=[kids.WAIT_TOOL],
        )
        parent_model = model if where == "model=None" else FunctionModel(parent_step)
        async with extension_on(containment, definition, broker=brokered) as extension:
            client = await create_agent(
                parent_model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
            )
            async with client:
                run = asyncio.ensure_future(client.run("remote"))
                async with child_held(ready, go_fd) as pid:
                    assert pid == only_task(extension).pid
                    environ, found = await environ_and_memory(pid, key)
                async with asyncio.timeout(HANG_GUARD):
                    await run
            task = only_task(extension)
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    assert found[b"You are the child."], "the scan must see what the child holds"
    assert key.encode() not in environ
    if brokered:
        assert not found[key.encode()], "the key is in the brokered child's memory"
        child_requests = [
            h for h, b in zip(endpoint.headers, endpoint.requests, strict=True) if _is_child(b)
        ]
        assert child_requests and all(h["authorization"] == f"Bearer {key}" for h in child_requests)
    else:  # the same scan finds it when the model travels with its key: the test can fail
        assert found[key.encode()]


@pytest.mark.parametrize("source", ["argument", "environment"])
async def test_a_sandboxed_childs_key_stays_in_the_parent(
    containment: str,
    fifos: tuple[str, str, int],
    source: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandboxed child (no network) on OpenAIChatModel completes through the parent: the
    endpoint sees the key, which is in neither the child's environment nor its memory, whether
    the model was given it or reads it from the host's environment (which every pool process
    inherited, and the sandbox wipes from the job's memory)."""
    ready, go, go_fd = fifos
    key = new_key()
    assert key not in os.environ.values()
    variable = f"ZETT_TEST_KEY_{secrets.token_hex(4).upper()}"
    if source == "environment":
        monkeypatch.setenv(variable, key)  # before the pool starts: its launcher inherits it
    wait = {"ready": ready, "go": go}

    def answer(request: ModelRequest) -> AssistantMessage:  # behind the endpoint
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            return AssistantMessage(tool_calls=(ToolCall("w", "wait_here", wait),))
        return AssistantMessage(f"done: {results[0].text}")

    async with OfflineEndpoint(answer) as endpoint:
        model = OpenAIChatModel(
            "test-model",
            base_url=endpoint.url,
            api_key=key if source == "argument" else None,
            api_key_env=variable,
        )
        sandbox = Sandbox(read=[go], write=[ready], network="none")
        definition = SubAgentDefinition(
            "sandboxed", "a child that waits", "You are the child.", model=model,
            tools=[kids.WAIT_TOOL], sandbox=sandbox,
        )  # fmt: skip
        async with (
            ProcessPool(2, containment=containment) as pool,
            Recording([definition], runner=ProcessRunner(pool)) as extension,
        ):
            run = asyncio.ensure_future(run_parent(extension, "sandboxed"))
            async with child_held(ready, go_fd) as pid:
                environ, found = await environ_and_memory(pid, key)
            async with asyncio.timeout(HANG_GUARD):
                await run
            task = only_task(extension)
            info = extension.task_info(task)
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    assert info["sandbox"]["network"] == "none"
    assert info["broker"]["calls"] == 2
    assert found[b"You are the child."], "the scan must see what the child holds"
    assert key.encode() not in environ
    assert not found[key.encode()], "the key is in the sandboxed child's memory"
    assert endpoint.headers and all(h["authorization"] == f"Bearer {key}" for h in endpoint.headers)


@pytest.mark.parametrize("brokered", [True, False], ids=["brokered-default", "control-unbrokered"])
async def test_the_key_variables_are_wiped_from_a_brokered_childs_environment_and_memory(
    containment: str,
    fifos: tuple[str, str, int],
    brokered: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY`` and the model's own ``api_key_env`` are in the
    host's environment when the pool starts, so its launcher and every worker inherit them. A
    brokered child (the default runner) has them in neither its environment (``/proc/PID/
    environ``, ``os.environ``) nor any readable page of its memory; the parent still sends
    the model's key. The control child, calling its model itself, holds all three."""
    ready, go, go_fd = fifos
    keys = {name: new_key() for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    variable = f"ZETT_TEST_KEY_{secrets.token_hex(4).upper()}"
    keys[variable] = new_key()
    for name, key in keys.items():
        monkeypatch.setenv(name, key)  # before the pool starts: its launcher inherits them
    wait = {"ready": ready, "go": go}

    def answer(request: ModelRequest) -> AssistantMessage:  # behind the endpoint
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            return AssistantMessage(tool_calls=(ToolCall("w", "wait_here", wait),))
        return AssistantMessage(f"done: {results[0].text}")

    async with OfflineEndpoint(answer) as endpoint:
        model = OpenAIChatModel("test-model", base_url=endpoint.url, api_key_env=variable)
        definition = SubAgentDefinition(
            "remote", "a child that waits", "You are the child.", model=model,
            tools=[kids.WAIT_TOOL],
        )  # fmt: skip
        runner = {} if brokered else {"broker": False}
        async with (
            ProcessPool(2, containment=containment) as pool,
            Recording([definition], runner=ProcessRunner(pool, **runner)) as extension,
        ):
            run = asyncio.ensure_future(run_parent(extension, "remote"))
            async with child_held(ready, go_fd) as pid:
                environ = await asyncio.to_thread(Path(f"/proc/{pid}/environ").read_bytes)
                needles = [key.encode() for key in keys.values()] + [b"You are the child."]
                found = await asyncio.to_thread(memory_holds, pid, needles)
            async with asyncio.timeout(HANG_GUARD):
                await run
            task = only_task(extension)
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    assert found[b"You are the child."], "the scan must see what the child holds"
    for name, key in keys.items():
        if brokered:
            assert key.encode() not in environ, f"${name} is in the brokered child's environment"
            assert not found[key.encode()], f"${name}'s value is in the brokered child's memory"
        else:  # the same checks find them in a child that calls its model itself
            assert f"{name}={key}".encode() in environ
            assert found[key.encode()]
    bearer = f"Bearer {keys[variable]}"
    assert endpoint.headers and all(h["authorization"] == bearer for h in endpoint.headers)


def _environment_and_pid(name: str) -> list[Any]:
    return [os.environ.get(name), os.getpid()]


async def test_a_brokered_childs_worker_runs_no_later_job_that_would_miss_the_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A brokered child unsets the key variables in its process for good, so its worker is
    retired once it answered, even in a pool that reuses its workers: a later job in the same
    one-worker pool (a child that calls its model itself, a plain job) still finds
    ``$OPENAI_API_KEY``, in a process of its own."""
    key = new_key()
    monkeypatch.setenv("OPENAI_API_KEY", key)  # before the pool starts: its launcher inherits it
    definition = SubAgentDefinition(
        "pid", "a child", "You are the child.", model=FunctionModel(kids.pid_step),
        tools=[kids.PID_TOOL],
    )  # fmt: skip
    async with ProcessPool(1, max_jobs_per_worker=100) as pool:
        async with Recording([definition], runner=ProcessRunner(pool)) as extension:
            answer = await run_parent(extension, "pid")
        child_pid = json.loads(json.loads(answer)["content"])["pid"]
        async with asyncio.timeout(HANG_GUARD):
            seen, pid = await pool.submit(_environment_and_pid, "OPENAI_API_KEY")
    assert only_task(extension).status is SubAgentTaskStatus.COMPLETED
    assert seen == key, "a job after a brokered child lost the key its launcher holds"
    assert pid != child_pid


def _is_child(body: dict[str, Any]) -> bool:
    return body["messages"][0] == {"role": "system", "content": "You are the child."}


# -- errors and ends --------------------------------------------------------------------------


async def test_transient_errors_are_retried_by_the_child_and_a_bad_request_fails_it(
    containment: str,
) -> None:
    key = new_key()
    replies = [
        json_reply(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}),
        json_reply(500, {"error": {"message": "boom"}}),
        Reply(chunks=TEXT_STREAM),
        json_reply(400, {"error": {"message": "no such parameter"}}),
    ]
    async with LoopbackServer(replies) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, api_key=key, retry=FAST_RETRY)
        definition = SubAgentDefinition("remote", "a child", "You are the child.", model=model)
        async with extension_on(containment, definition) as extension:
            answer = await run_parent(extension, "remote")
            retried = only_task(extension)
            assert retried.status is SubAgentTaskStatus.COMPLETED, retried.error
            assert json.loads(answer)["content"] == "Hello"
            assert len(server.requests) == 3  # two transient failures, retried in the child
            assert extension.task_info(retried)["broker"] == {"calls": 3, "refused": 0}

            await run_parent(extension, "remote", session_id="second")
            failed = extension.started[-1]  # type: ignore[attr-defined]
    assert failed.status is SubAgentTaskStatus.FAILED
    assert "HTTP 400" in (failed.error or "") and "no such parameter" in (failed.error or "")
    assert len(server.requests) == 4  # not retried
    assert all(r.headers["authorization"] == f"Bearer {key}" for r in server.requests)


HELD = Reply(chunks=sse(chunk({"role": "assistant", "content": "Hel"}), done=False), hold=True)


@pytest.mark.parametrize("how", ["SIGKILL", "task_cancel"])
async def test_a_child_that_dies_mid_stream_closes_the_upstream_request(
    containment: str, how: str
) -> None:
    async with CountingServer([HELD]) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, api_key=new_key())
        definition = SubAgentDefinition("remote", "a child", "You are the child.", model=model)
        async with extension_on(containment, definition) as extension:
            run = asyncio.ensure_future(run_parent(extension, "remote"))
            async with asyncio.timeout(HANG_GUARD):
                await server.holding.wait()  # the child's call is upstream, held open
            task = only_task(extension)
            assert server.gone == 0 and task.status is SubAgentTaskStatus.RUNNING
            if how == "SIGKILL":
                assert task.pid is not None
                os.kill(task.pid, signal.SIGKILL)
            else:
                await extension.cancel(task)
            await server.until_gone(1)  # the provider request was closed
            async with asyncio.timeout(HANG_GUARD):
                await run
    assert task.status in (SubAgentTaskStatus.FAILED, SubAgentTaskStatus.CANCELLED)
    if how == "SIGKILL":
        assert "SIGKILL" in (task.error or "")
    # the call its end cut short is charged its estimate: the system prompt and the prompt in,
    # and what streamed out (the "Hel" the server sent, if it arrived in time: one token)
    assert task.input_tokens == estimated_tokens(len("You are the child.") + len("do the work"))
    assert task.output_tokens in (0, 1)


async def test_a_child_that_closes_its_stream_cancels_the_parents_call(
    fifos: tuple[str, str, int],
) -> None:
    _ready, go, go_fd = fifos
    replies = [
        Reply(chunks=tool_call_stream("close_early", {"go": go})),
        HELD,
        Reply(chunks=TEXT_STREAM),
    ]
    async with CountingServer(replies) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, api_key=new_key())
        definition = SubAgentDefinition(
            "remote", "a child", "You are the child.", model=model, tools=[kids.CLOSE_EARLY_TOOL]
        )
        async with Recording([definition], runner=ProcessRunner(broker=True)) as ext:
            run = asyncio.ensure_future(run_parent(ext, "remote"))
            await server.until_gone(1)  # closed while the child still runs (it waits on go)
            task = only_task(ext)
            assert task.status is SubAgentTaskStatus.RUNNING
            os.write(go_fd, b"go\n")
            answer = await run
    assert json.loads(answer)["content"] == "Hello"
    assert task.status is SubAgentTaskStatus.COMPLETED
    assert server.requests[2].body["messages"][-1]["content"] == "Hel"


# -- what a call costs ------------------------------------------------------------------------


async def test_a_child_that_abandons_every_stream_is_charged_and_stopped_by_its_budget() -> None:
    # the child drops each call after its first delta, before the completed event that carries
    # the usage: each is charged its estimate (400 characters in: 100 tokens; "Hel" out: 1),
    # and the call that would go past the budget is never made
    text = "x" * 400
    replies = [Reply(chunks=tool_call_stream("abandon", {})), *([HELD] * 40)]
    async with CountingServer(replies) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, api_key=new_key())
        definition = SubAgentDefinition(
            "remote",
            "a child",
            "You are the child.",
            model=model,
            tools=[kids.abandon_tool(40, text)],
            token_budget=1000,
        )
        async with Recording([definition], runner=ProcessRunner(broker=True)) as ext:
            await run_parent(ext, "remote")
            task = only_task(ext)
            info = ext.task_info(task)
            await server.until_gone(9)
    # the first turn reported 20 + 5; nine calls at 101 each: 934, and the tenth needs 100 more
    assert task.status is SubAgentTaskStatus.FAILED
    assert task.error == (
        "token budget exceeded (used 934 of 1000 tokens, "
        "and its next model call needs about 100 more)"
    )
    assert (task.input_tokens, task.output_tokens) == (20 + 9 * 100, 5 + 9 * 1)
    assert len(server.requests) == 1 + 9  # the tenth never reached the provider
    assert info["broker"] == {"calls": 1 + 9, "refused": 0}


# -- a hostile child --------------------------------------------------------------------------


async def test_a_hostile_child_gets_errors_and_the_parent_stays_unharmed(
    containment: str,
    fifos: tuple[str, str, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _ready, go, go_fd = fifos
    max_calls, max_request = 3, 200_000
    monkeypatch.setattr(_broker, "MAX_CALLS", max_calls)
    monkeypatch.setattr(_broker, "MAX_REQUEST_BYTES", max_request)
    replies = [
        Reply(chunks=tool_call_stream("attack", {"go": go})),
        *([HELD] * max_calls),
        Reply(chunks=TEXT_STREAM),  # the stand-in's call after the attack
        Reply(chunks=TEXT_STREAM),  # the child's last turn
        Reply(chunks=TEXT_STREAM),  # a second, well-behaved child
    ]
    async with CountingServer(replies) as server:
        model = OpenAIChatModel("test-model", base_url=server.url, api_key=new_key())
        hostile = SubAgentDefinition(
            "hostile",
            "a child that breaks the rules",
            "You are the child.",
            model=model,
            tools=[kids.attack_tool(max_calls, max_request)],
        )
        calm = SubAgentDefinition("calm", "a child", "You are the child.", model=model)
        async with extension_on(containment, hostile, calm) as extension:
            run = asyncio.ensure_future(run_parent(extension, "hostile"))
            await server.until_gone(max_calls)  # each cancel closed its upstream request
            os.write(go_fd, b"go\n")
            answer = await run
            attacker = only_task(extension)
            info = extension.task_info(attacker)
            second = await run_parent(extension, "calm", session_id="second")

    assert attacker.status is SubAgentTaskStatus.COMPLETED, attacker.error
    assert json.loads(answer)["content"] == "Hello"
    assert json.loads(second)["content"] == "Hello"
    report = json.loads(server.requests[-2].body["messages"][-1]["content"])
    assert report["after"] == "Hello"  # served after all that
    answers = report["answers"]
    first = answers[:14]  # the answers to the malformed messages, in any order
    unnamed = [a["error"]["message"] for a in first if a["id"] is None]
    assert len(unnamed) == 5 and "must be an object" in unnamed[0]
    assert all("integer id" in text for text in unnamed[1:])
    named = {a["id"]: a["error"]["message"] for a in first if a["id"] is not None}
    expected = {
        5: "unknown broker op 'steal'",
        6: "exactly the keys op, id, slot, request",
        7: "slot 99 is not a model the parent brokers",
        8: "slot '0' is not a model",
        9: "malformed request: request must have exactly the keys",
        10: "request.messages[0].content must be a string, got int",
        11: "request.messages[0] must have exactly the keys content, role (unknown base_url)",
        12: "request must have exactly the keys messages, metadata, system_prompt, tools",
        13: f"at most {max_request}",
    }
    assert sorted(named) == sorted(expected)
    for call_id, text in expected.items():
        assert text in named[call_id], (call_id, named[call_id])
    expected_count = len(first)
    busy = [a for a in answers[expected_count:] if "error" in a]
    assert sorted(a["id"] for a in busy) == [100, 100 + max_calls, 101 + max_calls]
    assert {a["error"]["retryable"] for a in busy if a["id"] != 100} == {True}
    assert any("already in use" in a["error"]["message"] for a in busy if a["id"] == 100)
    deltas = [a for a in answers[expected_count:] if "text" in a]
    assert sorted(a["id"] for a in deltas) == list(range(100, 100 + max_calls))
    # only allowed calls reached the endpoint: two turns, the held calls, the one after the
    # attack, and the second child's
    assert len(server.requests) == 2 + max_calls + 1 + 1
    assert info["broker"]["refused"] >= expected_count + 3 + 2000
    assert info["broker"]["calls"] == 2 + max_calls + 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- children of children ---------------------------------------------------------------------


async def test_a_brokered_childs_own_children_relay_through_it_and_hold_no_key(
    fifos: tuple[str, str, int],
) -> None:
    ready, go, go_fd = fifos
    key = new_key()
    wait = {"ready": ready, "go": go}

    def answer(request: ModelRequest) -> AssistantMessage:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if request.system_prompt == "You are the grandchild.":
            if not results:
                return AssistantMessage(tool_calls=(ToolCall("w", "wait_here", wait),))
            return AssistantMessage("the grandchild's report")
        if request.system_prompt == "You orchestrate.":
            if not results:
                args = {"subagent_type": "worker", "description": "w", "prompt": "work"}
                return AssistantMessage(tool_calls=(ToolCall("s", "task_start", args),))
            if len(results) == 1:
                read = {"task_id": json.loads(results[0].text)["task_id"], "wait_seconds": 60}
                return AssistantMessage(tool_calls=(ToolCall("o", "task_output", read),))
            return AssistantMessage("relayed: " + json.loads(results[1].text)["content"])
        raise AssertionError(f"unexpected request: {request.system_prompt!r}")

    async with OfflineEndpoint(answer) as endpoint:
        model = OpenAIChatModel("test-model", base_url=endpoint.url, api_key=key)
        worker = SubAgentDefinition(
            "worker", "a grandchild", "You are the grandchild.", model=model, tools=[kids.WAIT_TOOL]
        )
        orchestrator = SubAgentDefinition(
            "orchestrator",
            "a child with children",
            "You orchestrate.",
            model=model,
            extensions=[AsyncSubAgentExtension([worker])],  # a plain runner: it relays
        )
        async with Recording([orchestrator], runner=ProcessRunner(broker=True)) as ext:
            run = asyncio.ensure_future(run_parent(ext, "orchestrator"))
            async with child_held(ready, go_fd) as grandchild:
                child = only_task(ext).pid
                assert child is not None and grandchild != child
                seen = {
                    pid: await asyncio.to_thread(memory_holds, pid, [key.encode(), b"grandchild."])
                    for pid in (child, grandchild)
                }
            answer_text = await run
    assert json.loads(answer_text)["content"] == "relayed: the grandchild's report"
    for pid, found in seen.items():
        assert found[b"grandchild."], f"the scan of {pid} must see the definition"
        assert not found[key.encode()], f"the key is in the memory of {pid}"
    prompts = {body["messages"][0]["content"] for body in endpoint.requests}
    assert prompts == {"You orchestrate.", "You are the grandchild."}
    assert all(h["authorization"] == f"Bearer {key}" for h in endpoint.headers)
    assert info_calls(ext) == len(endpoint.requests)  # all of them made by the parent


def info_calls(extension: AsyncSubAgentExtension) -> int:
    return int(extension.task_info(only_task(extension))["broker"]["calls"])


# -- the parts ---------------------------------------------------------------------------------


def test_requests_travel_as_json_and_back_unchanged() -> None:
    request = ModelRequest(
        (
            UserMessage("hi"),
            AssistantMessage("calling", (ToolCall("c1", "grep", {"pattern": "x", "n": [1]}),)),
            ToolMessage("c1", "grep", "no match", ToolStatus.FAILED),
            AgentMessage("a notice", source="tasks"),
        ),
        tools=(ToolSpec("grep", "search", {"type": "object", "properties": {}}),),
        system_prompt="be brief",
        metadata={"trace": "t-1"},
    )
    wire = json.loads(json.dumps(encode_request(request)))
    assert decode_request(wire) == request


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ([], "request must be an object, got list"),
        ({"messages": []}, "missing metadata, system_prompt, tools"),
        (
            {"messages": "x", "tools": [], "system_prompt": None, "metadata": {}},
            "request.messages must be a list, got str",
        ),
        (
            {"messages": [], "tools": [{"name": "t"}], "system_prompt": None, "metadata": {}},
            "request.tools[0] must have exactly the keys",
        ),
        (
            {"messages": [], "tools": [], "system_prompt": 3, "metadata": {}},
            "request.system_prompt must be a string or null, got int",
        ),
        (
            {
                "messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}],
                "tools": [],
                "system_prompt": None,
                "metadata": {},
            },
            "request.messages[0].tool_calls[0] must have exactly the keys",
        ),
        (
            {
                "messages": [
                    {"role": "tool", "call_id": "1", "name": "t", "text": "", "status": "root"}
                ],
                "tools": [],
                "system_prompt": None,
                "metadata": {},
            },
            "request.messages[0].status must be one of ok, failed, skipped",
        ),
    ],
)
def test_a_malformed_request_is_refused_naming_where(bad: Any, where: str) -> None:
    with pytest.raises(BadRequest) as caught:
        decode_request(bad)
    assert where in str(caught.value)


def test_every_brokerable_model_is_replaced_wherever_it_is() -> None:
    key = new_key()
    model = OpenAIChatModel("inner-model", base_url="http://127.0.0.1:9/v1", api_key=key)
    other = OpenAIChatModel("other-model", base_url="http://127.0.0.1:9/v1", api_key=key + "x")

    def uses_a_model() -> str:
        """A tool that closes over a model."""
        return repr(other)

    nested = SubAgentDefinition("inner", "nested", "p", model=model)
    outer = SubAgentDefinition(
        "outer",
        "outer",
        "p",
        model=model,
        tools=[uses_a_model],
        extensions=[AsyncSubAgentExtension([nested])],
    )
    payload, models = _broker.pickle_brokered((outer, model, {"state": [other]}))
    assert key.encode() not in payload
    assert models == [model, other]  # each real model once, by identity
    copy, same, state = cloudpickle.loads(payload)
    assert not relaying()  # a stand-in unpickled here does not make this process a relay
    assert isinstance(copy.model, BrokeredModel) and same is copy.model
    assert (copy.model.slot, copy.model.model, copy.model.retry) == (0, "inner-model", model.retry)
    assert isinstance(state["state"][0], BrokeredModel) and state["state"][0].slot == 1
    [inner_extension] = copy.extensions
    assert inner_extension.subagents[0].model is copy.model
    assert "through the parent" in repr(copy.model)


class FakeJob:
    """What a ``Broker`` needs of a job: ``send`` (recorded; refused once ``ended``)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.ended = False

    async def send(self, value: Any, *, topic: str = "") -> None:
        if self.ended:
            raise RuntimeError("not running")
        json.dumps(value)  # what the engine would refuse
        self.sent.append(value)


def call(call_id: int, text: str = "hi") -> dict[str, Any]:
    request = encode_request(ModelRequest((UserMessage(text),)))
    return {_broker.KEY: {"op": "call", "id": call_id, "slot": 0, "request": request}}


async def settle(broker: _broker.Broker) -> None:
    async with asyncio.timeout(HANG_GUARD):
        while broker.busy:  # a finished notifier may have started the next one
            await broker.wait_closed()


async def test_refusals_made_as_the_notifier_ends_are_still_sent() -> None:
    job = FakeJob()
    broker = _broker.Broker(job, [ScriptedModel(["x"])])  # type: ignore[arg-type]
    assert broker.accept({_broker.KEY: "bad"}, 10)
    await asyncio.sleep(0)  # the notifier sent it and ended; its done callback is still due
    assert len(job.sent) == 1 and broker._notifier is not None and broker._notifier.done()
    assert broker.accept({_broker.KEY: "worse"}, 10)
    await settle(broker)
    assert [a["id"] for a in job.sent] == [None, None]
    assert all("must be an object" in a["error"]["message"] for a in job.sent)


async def test_what_a_model_does_wrong_becomes_an_error_answer() -> None:
    class Broken:
        retry = RetryOptions()

        def __init__(self, how: str) -> None:
            self.how = how

        async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
            if self.how == "raise":
                raise KeyError("internal")
            yield from_text("partial")

    from zett_agent._model import ModelEvent

    def from_text(text: str) -> ModelEvent:
        return ModelEvent.text_delta(text)

    for how, expected in [
        ("raise", "the parent's model failed (KeyError"),
        ("no-completed", "ended its stream without a completed response"),
    ]:
        job = FakeJob()
        broker = _broker.Broker(job, [Broken(how)])  # type: ignore[arg-type]
        assert broker.accept(call(1), 100)
        await settle(broker)
        assert expected in job.sent[-1]["error"]["message"]
        assert job.sent[-1]["id"] == 1 and job.sent[-1]["error"]["retryable"] is False


async def test_the_broker_leaves_other_events_and_never_raises() -> None:
    job = FakeJob()
    broker = _broker.Broker(job, [ScriptedModel(["x"])])  # type: ignore[arg-type]
    for event in [{"kind": "turn_started"}, "text", 3, None, [1]]:
        assert broker.accept(event, 10) is False  # progress: the extension's
    weird: list[Any] = [None, 1.5, [], {"op": None}, {"id": 1, "op": ["call"]}, {"id": 2**80}]
    for message in weird:
        assert broker.accept({_broker.KEY: message}, 10) is True
    assert broker.accept(call(7), _broker.MAX_REQUEST_BYTES + 1)
    await settle(broker)
    assert broker.refused == len(weird) + 1 and broker.calls == 0
    broker.close()
    assert broker.accept(call(8), 10) and broker.calls == 0  # closed: nothing more is served


async def test_a_large_request_is_checked_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_broker, "_SLICE", 0.0)  # yield after every step of the decoder
    job = FakeJob()
    broker = _broker.Broker(job, [ScriptedModel(["done"])])  # type: ignore[arg-type]
    messages = tuple(UserMessage(f"line {i}") for i in range(10_000))
    request = encode_request(ModelRequest(messages))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.ensure_future(ticker())
    assert broker.accept({_broker.KEY: {"op": "call", "id": 1, "slot": 0, "request": request}}, 1)
    await settle(broker)
    ticking.cancel()
    assert job.sent[-1]["done"]["message"]["content"] == "done"
    assert ticks >= 10_000 // 256  # the loop ran other callbacks between the slices
