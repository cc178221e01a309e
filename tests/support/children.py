"""Child behaviours: what the tests' child agents do in their own processes.

One definition each of spinning, crashing, hogging memory, burning CPU, waiting on the test
and reporting moments to it, for every runner (pool processes, in-process children, Ray
workers). Everything is defined at module level of this importable module, so a child loads
it by reference: the pool's launcher inherits ``sys.path`` (pytest's ``pythonpath`` puts
``tests/`` there) and the Ray cluster's workers get ``tests/`` in ``PYTHONPATH``.

Children report moments through a datagram socket: ``beacon`` sends a JSON object,
``announce`` the object ``{"label": label, "pid": <its pid>}``; ``support.beacons.Beacons``
is the test's end. Children that wait for the test read a FIFO the test writes to
(``fifo_gate``, in the event loop: a cancelled child is never left with a thread blocked in
``open``).
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

from zett_agent.agent import AgentRunContext
from zett_agent.extensions import Extension, ModelCallNext
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.tools import AgentTool

# -- talking to the test ------------------------------------------------------------------------


def beacon(path: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` as one JSON datagram to the test's socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(json.dumps(payload).encode(), path)


def announce(path: str, label: str) -> None:
    """Tell the test that ``label`` happened, in this process."""
    beacon(path, {"label": label, "pid": os.getpid()})


async def fifo_gate(path: str) -> bytes:
    """Wait, in the event loop, until the test writes to the FIFO ``path``; return what it
    wrote. Opened read-write, so it never reads an end of file while no writer is there."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    loop = asyncio.get_running_loop()
    try:
        while True:
            ready = loop.create_future()
            loop.add_reader(fd, ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(fd)
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if chunk:
                return chunk
    finally:
        os.close(fd)


def schema(**properties: str) -> dict[str, Any]:
    """A tool's JSON schema: an object with ``properties`` (name -> JSON type)."""
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
    }


def reply(message: AssistantMessage, usage: Usage | None = None) -> ModelEvent:
    """The one event of a scripted model's answer."""
    return ModelEvent.completed(ModelResponse(message, usage))


def user_texts(request: ModelRequest) -> list[str]:
    """The user messages of ``request``, in order."""
    return [m.content for m in request.messages if isinstance(m, UserMessage)]


# -- what a tool does ---------------------------------------------------------------------------


def spin(ready_fifo: str = "") -> str:
    """Spin forever in pure Python (never yielding to the event loop): only a kill ends it.
    With ``ready_fifo``, first write this process's pid to that FIFO."""
    if ready_fifo:
        with open(ready_fifo, "wb") as fifo:  # tell the test which process now spins
            fifo.write(str(os.getpid()).encode())
    while True:
        pass


def segfault() -> str:
    """Crash with a real SIGSEGV."""
    ctypes.string_at(0)
    return "unreachable"


def hog_memory(megabytes: int) -> str:
    """Allocate (and touch) ``megabytes`` MiB."""
    chunks = [bytearray(1024 * 1024) for _ in range(megabytes)]
    return f"allocated {len(chunks)} MiB"


def burn(seconds: float) -> str:
    """Burn ``seconds`` of CPU time hashing; return a bit of the digest."""
    end = time.process_time() + seconds
    digest = b""
    while time.process_time() < end:
        for _ in range(1000):
            digest = hashlib.sha256(digest).digest()
    return digest.hex()[:8]


def _burn_timed(seconds: float) -> str:
    start = time.time()
    burn(seconds)
    return json.dumps({"start": start, "end": time.time()})


def _whoami() -> str:
    return str(os.getpid())


def _priority() -> str:
    """This process's niceness and its session's (its autogroup's, for the scheduler)."""
    with open("/proc/self/autogroup") as file:
        words = file.read().split()  # "/autogroup-123 nice 10"
    return json.dumps([os.nice(0), int(words[-1]) if words else 0])


def _loaded(names: str) -> str:
    import sys

    return ",".join(name for name in names.split(",") if name in sys.modules)


def _report_progress() -> str:
    from zett_agent.process import emit

    emit({"kind": "progress", "done": 1, "total": 3})
    emit({"kind": "progress", "done": 2, "total": 3})
    # Not counts: each is ignored, and the last good report stands.
    for bad in ({"done": -1}, {"done": True}, {"done": "3"}, {"done": 3, "total": 2.5}, {}):
        emit({"kind": "progress", **bad})
    return "reported"


async def _gate(path: str) -> str:
    return (await fifo_gate(path)).decode()


def _mark(path: str, label: str) -> str:
    announce(path, label)
    return f"ran {label}"


def wait_on_fifo(path: str) -> str:
    """A pool job: tell the parent it runs, then block until the parent writes a line to the
    FIFO ``path``; return that line."""
    from zett_agent.process import emit

    emit("ready")
    with open(path, "rb") as stream:
        return stream.readline().decode().strip()


def setsid_escapee() -> int:
    """Start a grandchild the way a daemon escapes (fork, ``setsid``, fork again, the middle
    exits); return its pid. It sleeps until it is killed."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            while True:
                time.sleep(1)
        os._exit(0)
    os.waitpid(middle, 0)
    return int(os.read(read_end, 32))


def escape_then_wait() -> None:
    """A pool job: emit ``[its pid, a setsid escapee's pid]``, then wait to be killed."""
    from zett_agent.process import emit

    emit([os.getpid(), setsid_escapee()])
    while True:
        time.sleep(1)


async def _hang() -> str:
    await asyncio.Event().wait()
    return "unreachable"


SPIN = AgentTool("spin", "Spin forever.", schema(ready_fifo="string"), spin)
SEGFAULT = AgentTool("segfault", "Crash.", schema(), segfault)
HOG = AgentTool("hog", "Allocate memory.", schema(megabytes="integer"), hog_memory)
BURN = AgentTool("burn", "Burn CPU.", schema(seconds="number"), burn)
#: burns CPU and answers when it started and ended (wall clock), as JSON
BURN_TIMED = AgentTool("burn", "Burn CPU, say when.", schema(seconds="number"), _burn_timed)
WHOAMI = AgentTool("whoami", "Return the pid.", schema(), _whoami)
#: answers ``[its niceness, its session's niceness]`` as JSON
PRIORITY = AgentTool("priority", "Say how nice.", schema(), _priority)
#: answers which of the comma-separated module ``names`` the child's process has imported
LOADED = AgentTool("loaded", "Say which modules are imported.", schema(names="string"), _loaded)
#: reports progress 2 of 3, then progress reports of every wrong shape
PROGRESS = AgentTool("progress", "Report progress.", schema(), _report_progress)
#: waits for the test's FIFO ``path`` in the child's event loop (the child reads messages
#: meanwhile) and answers what the test wrote
GATE = AgentTool("gate", "Wait for the test.", schema(path="string"), _gate)
#: announces ``label`` and answers ``ran <label>``
MARK = AgentTool("mark", "Say that it ran.", schema(path="string", label="string"), _mark)
HANG = AgentTool("hang", "Never return.", schema(), _hang)


# -- child models -------------------------------------------------------------------------------


class BlockingModel:
    """A child whose model never answers (until its process is killed)."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        await asyncio.Event().wait()
        yield reply(AssistantMessage("unreachable"))


class AnnounceAndBlock:
    """A child that announces ``label`` and then waits until its process is killed."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str) -> None:
        self.path = path
        self.label = label

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        announce(self.path, self.label)
        await asyncio.Event().wait()
        yield reply(AssistantMessage("unreachable"))


class GatedAnswer:
    """Its only model call: announce ``label``, wait for the FIFO ``gate``, then answer
    ``answer`` (no tool calls)."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str, gate: str, answer: str = "gated answer") -> None:
        self.path = path
        self.label = label
        self.gate = gate
        self.answer = answer

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        announce(self.path, self.label)
        await fifo_gate(self.gate)
        yield reply(AssistantMessage(self.answer))


class Listener:
    """Call 1: announce ``label``, then call the ``gate`` tool (which waits for the test).
    Call 2: answer with the user messages its request held, as JSON ``{"users": [...]}``."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str, gate: str) -> None:
        self.path = path
        self.label = label
        self.gate = gate

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            announce(self.path, self.label)
            call = ToolCall("g", "gate", {"path": self.gate})
            yield reply(AssistantMessage(tool_calls=(call,)))
            return
        yield reply(AssistantMessage(json.dumps({"users": user_texts(request)})))


class TwoMarksThenReport:
    """Call 1 asks for two ``mark`` calls; call 2 answers with how its tool calls ended and
    the user messages it saw."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str) -> None:
        self.path = path

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            calls = tuple(
                ToolCall(f"m{i}", "mark", {"path": self.path, "label": f"mark-{i}"})
                for i in range(2)
            )
            yield reply(AssistantMessage(tool_calls=calls))
            return
        report = {
            "tools": [[m.status.value, m.text] for m in results],
            "users": user_texts(request),
        }
        yield reply(AssistantMessage(json.dumps(report)))


class HoldFirstCall(Extension):
    """A child extension: its first model call waits until a steering message is pending
    (it stands for a long model call during which the parent's message arrives); it
    announces ``label`` once it waits."""

    def __init__(self, path: str, label: str) -> None:
        super().__init__()
        self.path = path
        self.label = label
        self.calls = 0

    async def on_model_request(
        self, context: AgentRunContext, request: ModelRequest, call_next: ModelCallNext
    ) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        if self.calls == 1:
            announce(self.path, self.label)
            await context._run.steered.wait()  # set by Agent.steer
        async for event in call_next(request):
            yield event


class GateModel:
    """A child that answers ``answer`` once the test wrote to the FIFO at ``path`` and closed
    it (no sleeping)."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, answer: str = "released") -> None:
        self.path = path
        self.answer = answer

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        def read() -> bytes:
            with open(self.path, "rb") as fifo:
                return fifo.read()

        await asyncio.to_thread(read)
        yield reply(AssistantMessage(self.answer))
