"""AsyncSubAgentExtension (one OS process per child) against an in-process baseline, in one run.

    uv run python benchmarks/bench_subagents.py [--quick]
    uv run --extra ray python benchmarks/bench_subagents.py --ray [ADDRESS] [--quick]
    uv run python benchmarks/bench_subagents.py --sandbox [--quick]
    uv run python benchmarks/bench_subagents.py --talk [--quick]

The baseline (``_subagent_baseline.InProcessSubAgentExtension``) is the same extension with its
child runner swapped: each child agent runs as ``asyncio.create_task(agent.run(prompt))`` in the
parent's event loop and ``task_cancel`` is ``task.cancel()``. Both variants run the same parent
program (an offline ``StepModel`` calling the five task tools) and the same child agents.

What is measured:

1. ``task_start`` -> child running: from the moment the parent's ``task_start`` tool call begins
   until the child's first model call starts (the child writes its ``perf_counter`` stamp to a
   FIFO; it is ``CLOCK_MONOTONIC``, one clock for all processes). p50/p99 over N sequential
   start + ``task_output`` rounds on a warm extension; the first (cold) start is shown apart.
2. ``task_cancel`` -> gone, for a child whose tool spins in pure Python and never yields. Ours:
   from the call until the tool returns, which happens only after the process tree is gone
   (checked with psutil right then). The baseline runs in a separate Python process under a
   hang guard, because once its child spins the parent loop never runs again: neither the
   model's ``task_cancel`` nor a thread-safe cancel scheduled from another thread ever runs.
3. CPU-bound speedup: K children (K = CPU count, 2..4) each hashing for ~1 s (a fixed number of
   SHA-256 rounds, calibrated here), started in one turn and awaited with ``task_output``; wall
   time of the whole parent request, next to the same work run sequentially in this process and
   the machine's ceiling at that moment: K bare interpreters doing the same work at once (on a
   shared machine other load shows up there too). The four runs rotate their order per repeat.
4. Parent event-loop stall during (3): a ticker task in the parent measures how late each
   ``asyncio.sleep(0.005)`` wakes up; p50/p99/max.

Ratios are baseline / ours for times, so > 1 means the process version is faster.

``--ray [ADDRESS]`` adds a third runner, ``RayRunner`` (children as Ray tasks; a local Ray of
this machine's CPUs when no address is given, started once before the clock), to (1)-(4), and
prints one table with the three columns (no ratios); (5) is left out (a Ray worker per child is
not what one runs a hundred of on one machine). It adds (6): 50 children submitted at once
through the runner (``submit_function``), of which as many run as the machine has CPUs and the
rest wait for one, all cancelled at once: the longest the parent's event loop stalled meanwhile
(the ticker of (4)) and how long the 50 cancels took, for processes (a ``ProcessPool`` of one
worker per CPU) and Ray. And issue 34's Ray yardsticks, bare Ray tasks in the same Ray: a bare
generator task's start (stamped in the task, as the children stamp their first model call)
against (1); a bare spinning task's ``ray.cancel(force=True)`` until its process is gone against
(2); and 50 children that wait on their model (an endpoint that holds every request), started in
one turn with CPU enough for all to run (each needs a Ray worker of its own), until the endpoint
has all 50 requests, against 50 bare tasks that each send one request.

``--sandbox`` runs (1) only, for processes with and without a ``Sandbox`` around each child,
and prints what the sandbox adds.

``--talk`` measures what steering running children costs (issue 17), for processes and
in-process children (and Ray children with ``--talk --ray [ADDRESS]``): (6) ``task_message``
from the parent's send to the child having it, as the parent sees the child's
``message_received`` event (a round trip, so an upper bound on the one-way time; what then
waits in the child for its next model call is the child's own pace),
and (7) what ``store=`` (a ``TaskStore``) adds to the ``task_start`` tool call: its duration
with and without a store, alternating.

The child agents are defined in this script's ``__main__``, as in the guide's program, so
cloudpickle ships them by value and a fresh child process imports nothing for them. The
in-process baseline lives in ``_subagent_baseline.py``; it is never shipped to a child.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import psutil
from _subagent_baseline import InProcessSubAgentExtension

from zett_agent.agent import AgentRunConfig, AgentRunContext
from zett_agent.client import create_agent
from zett_agent.extensions import Extension, ToolCallNext
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.process import ProcessPool, Sandbox
from zett_agent.runners._process import warming as runner_warming
from zett_agent.tools import AgentTool, ToolResult

HANG_GUARD = 120.0  # seconds; a request of this benchmark that takes longer is a bug
TICK = 0.005
VARIANTS: tuple[str, ...] = ("process", "in-process")
#: the Ray address for the "ray" variant (--ray); None: a local Ray
RAY_ADDRESS: str | None = None
SCRIPT = os.path.abspath(__file__)
RAW_BURN = (
    "import hashlib, sys\n"
    "d = b''\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    d = hashlib.sha256(d).digest()\n"
)

# -- the child agents (both variants run these) -------------------------------------------


def announce(fifo: str, kind: str, stamp: float | None = None) -> None:
    """Write one ``kind pid stamp`` line to the benchmark's FIFO (never blocks)."""
    stamp = time.perf_counter() if stamp is None else stamp
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"{kind} {os.getpid()} {stamp!r}\n".encode())
    finally:
        os.close(fd)


class AnnouncingChild:
    """Announces ``start`` at its first model call, calls ``tools`` in order, then answers."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, fifo: str, tools: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
        self.fifo = fifo
        self.tools = list(tools)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        now = time.perf_counter()
        if not any(isinstance(m, AssistantMessage) for m in request.messages):
            announce(self.fifo, "start", now)
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if len(results) < len(self.tools):
            name, args = self.tools[len(results)]
            message = AssistantMessage(tool_calls=(ToolCall(f"c{len(results)}", name, args),))
        else:
            message = AssistantMessage(content=results[-1].text if results else "done")
        yield ModelEvent.completed(ModelResponse(message, Usage(7, 3)))


def burn(rounds: int) -> str:
    """Pure-Python CPU work: ``rounds`` chained SHA-256 hashes. Never yields."""
    digest = b""
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:8]


def spin(fifo: str) -> str:
    """Announce ``spin``, then loop forever in pure Python, never yielding."""
    announce(fifo, "spin")
    while True:
        pass


BURN = AgentTool(
    "burn",
    "Burn CPU.",
    {"type": "object", "properties": {"rounds": {"type": "integer"}}, "required": ["rounds"]},
    burn,
)
SPIN = AgentTool(
    "spin",
    "Spin forever.",
    {"type": "object", "properties": {"fifo": {"type": "string"}}, "required": ["fifo"]},
    spin,
)


# -- the parent side --------------------------------------------------------------------------

Step = AssistantMessage | Callable[[ModelRequest], AssistantMessage]


class StepModel:
    """The parent's offline model: answers model call ``n`` of a request with ``steps[n]``."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self.calls = 0

    async def stream(self, request: ModelRequest) -> Any:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        message = step(request) if callable(step) else step
        yield ModelEvent.completed(ModelResponse(message))


_ids = iter(range(1, 1 << 62))


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(f"call-{next(_ids)}", name, arguments)


def turn(*calls: ToolCall) -> AssistantMessage:
    return AssistantMessage(tool_calls=calls)


def last_result(request: ModelRequest) -> dict[str, Any]:
    [*_, last] = (m for m in request.messages if isinstance(m, ToolMessage))
    if last.failed:
        raise RuntimeError(f"a tool of the benchmark failed: {last.text}")
    result: dict[str, Any] = json.loads(last.text)
    return result


class Timing(Extension):
    """Stamps every tool call of the parent: ``(name, begin, end, result text)``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float, float, str]] = []
        #: pid announced by the spinning child, checked right after ``task_cancel`` returns
        self.spinning_pid: int | None = None
        self.gone_after_cancel: list[bool] = []

    async def on_tool_call(
        self, context: AgentRunContext, call: ToolCall, call_next: ToolCallNext
    ) -> ToolResult:
        begin = time.perf_counter()
        result = await call_next(call)
        end = time.perf_counter()
        if call.name == "task_cancel" and self.spinning_pid is not None:
            self.gone_after_cancel.append(gone(self.spinning_pid))
        self.calls.append((call.name, begin, end, str(result.content)))
        return result

    def of(self, name: str) -> list[tuple[float, float]]:
        return [(begin, end) for n, begin, end, _ in self.calls if n == name]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Announcements:
    """Reads the children's ``kind pid stamp`` lines from a FIFO on a thread.

    A thread, not ``loop.add_reader``: the in-process baseline blocks the loop, and the hang
    probe must still see (and print) that its child started spinning.
    """

    def __init__(
        self,
        directory: str,
        loop: asyncio.AbstractEventLoop,
        on_line: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self.path = os.path.join(directory, "announce")
        os.mkfifo(self.path)
        # O_RDWR: opening never blocks, and our own write end means no EOF between children.
        self._fd = os.open(self.path, os.O_RDWR)
        self._loop = loop
        self._on_line = on_line
        self._queues: dict[str, asyncio.Queue[tuple[int, float]]] = {}
        self._thread = threading.Thread(target=self._read, name="announcements", daemon=True)
        self._thread.start()

    def queue(self, kind: str) -> asyncio.Queue[tuple[int, float]]:
        return self._queues.setdefault(kind, asyncio.Queue())

    def _read(self) -> None:
        buffer = b""
        while True:
            buffer += os.read(self._fd, 4096)
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line == b"quit":
                    return
                kind, pid, stamp = line.decode().split()
                if self._on_line is not None:
                    self._on_line(kind, int(pid), float(stamp))
                self._loop.call_soon_threadsafe(
                    self.queue(kind).put_nowait, (int(pid), float(stamp))
                )

    def close(self) -> None:
        os.write(self._fd, b"quit\n")
        self._thread.join()
        os.close(self._fd)


def make_extension(
    variant: str, definitions: list[SubAgentDefinition], **options: Any
) -> AsyncSubAgentExtension:
    if variant == "ray":
        from zett_agent.runners.ray import RayRunner

        options.pop("max_children", None)  # Ray's CPUs bound what runs at once
        return AsyncSubAgentExtension(definitions, runner=RayRunner(RAY_ADDRESS), **options)
    cls = AsyncSubAgentExtension if variant == "process" else InProcessSubAgentExtension
    return cls(definitions, **options)


def profile(name: str, model: Any, tools: Sequence[AgentTool] = ()) -> SubAgentDefinition:
    return SubAgentDefinition(
        name, f"{name} (benchmark)", "You are a benchmark child.", model, tools
    )


async def run_parent(
    extension: AsyncSubAgentExtension,
    timing: Timing,
    steps: Sequence[Step],
    tools: Sequence[AgentTool] = (),
    then: Callable[[], Awaitable[object]] | None = None,
) -> str:
    """The parent program: one request of an agent driven by ``steps``; then ``then()``, while
    the agent is still open (closing it releases its session: its running tasks are cancelled
    and its task list is forgotten)."""
    config = AgentRunConfig(session_id="parent", max_turns=len(steps) + 2)
    client = await create_agent(
        StepModel(steps), config=config, extensions=[timing, extension], tools=tools
    )
    async with client, asyncio.timeout(HANG_GUARD):
        content = (await client.run("go")).content
        if then is not None:
            await then()
        return content


def start_and_read(subagent_type: str) -> list[Step]:
    return [
        turn(call("task_start", subagent_type=subagent_type, description="bench", prompt="go")),
        lambda r: turn(call("task_output", task_id=last_result(r)["task_id"], wait_seconds=60)),
    ]


# -- (1) task_start -> child running ------------------------------------------------------------


#: makes one variant's extension for a profile, given the benchmark's temporary directory
Factory = Callable[[SubAgentDefinition, str], AsyncSubAgentExtension]


async def measure_start(
    rounds: int, chunks: int, variants: dict[str, Factory] | None = None
) -> dict[str, dict[str, Any]]:
    """The variants side by side: ``chunks`` alternating parent requests of ``rounds`` starts
    (default: ``VARIANTS``, made by ``make_extension``)."""
    loop = asyncio.get_running_loop()
    if variants is None:
        variants = {
            v: functools.partial(lambda v, d, tmp: make_extension(v, [d]), v) for v in VARIANTS
        }
    results: dict[str, dict[str, Any]] = {v: {"start": [], "round": []} for v in variants}
    with tempfile.TemporaryDirectory(prefix="zett-bench-") as tmp:
        ann = Announcements(tmp, loop)
        queue = ann.queue("start")

        async def program(
            extension: AsyncSubAgentExtension, n: int
        ) -> tuple[list[float], list[float]]:
            """Run ``n`` start + read rounds; return start latencies and round trips."""
            timing = Timing()

            async def check() -> None:
                failed = [t.error for t in extension.tasks("parent") if t.error]
                if failed:
                    raise RuntimeError(f"a starter child failed: {failed[0]}")

            steps = [*start_and_read("starter") * n, final()]
            await run_parent(extension, timing, steps, then=check)
            stamps = [(await asyncio.wait_for(queue.get(), 10))[1] for _ in range(n)]
            begins = [begin for begin, _ in timing.of("task_start")]
            ends = [end for _, end in timing.of("task_output")]
            starts = [s - b for s, b in zip(stamps, begins, strict=True)]
            return starts, [e - b for e, b in zip(ends, begins, strict=True)]

        try:
            starter = profile("starter", AnnouncingChild(ann.path))
            async with contextlib.AsyncExitStack() as stack:
                extensions = {
                    v: await stack.enter_async_context(make(starter, tmp))
                    for v, make in variants.items()
                }
                for variant, extension in extensions.items():
                    # the first start of the process variant also boots its pool
                    [results[variant]["cold"]], _ = await program(extension, 1)
                for _ in range(chunks):
                    for variant, extension in extensions.items():
                        starts, trips = await program(extension, max(1, rounds // chunks))
                        results[variant]["start"] += starts
                        results[variant]["round"] += trips
        finally:
            ann.close()
    return results


def final(text: str = "finished") -> AssistantMessage:
    return AssistantMessage(content=text)


# -- (6), (7) talking to running children ---------------------------------------------------------


async def hold() -> str:
    """A child tool that runs until the child is cancelled: messages wait for it."""
    await asyncio.Event().wait()
    return "unreachable"


HOLD = AgentTool("hold", "Hold.", {"type": "object", "properties": {}}, hold)


async def measure_message(variant: str, tasks: int, per_task: int) -> list[float]:
    """Send ``per_task`` messages to each of ``tasks`` children held in a tool; return each
    message's time from send to the child's ``message_received`` event in the parent."""
    from zett_agent.runners import InProcessRunner

    with tempfile.TemporaryDirectory(prefix="zett-bench-") as tmp:
        ann = Announcements(tmp, asyncio.get_running_loop())
        try:
            holder = profile("holder", AnnouncingChild(ann.path, [("hold", {})]), (HOLD,))
            options: dict[str, Any] = {"extra_tools": ("task_message",)}
            if variant == "in-process":
                options["runner"] = InProcessRunner()
            elif variant == "ray":
                from zett_agent.runners.ray import RayRunner

                options["runner"] = RayRunner(RAY_ADDRESS)
            async with AsyncSubAgentExtension([holder], **options) as extension:
                steps = [
                    turn(call("task_start", subagent_type="holder", description="b", prompt="go"))
                ] * tasks
                config = AgentRunConfig(session_id="parent", max_turns=tasks + 2)
                # the client stays open while the messages go: closing it ends the tasks
                client = await create_agent(
                    StepModel([*steps, final()]), config=config, extensions=[extension]
                )
                async with client:
                    async with asyncio.timeout(HANG_GUARD):
                        await client.run("go")
                    times: list[float] = []
                    # what task_message queues with (the extension keeps it name-mangled)
                    mail = vars(extension)["_AsyncSubAgentExtension__mail"]
                    for task in extension.tasks("parent"):
                        await asyncio.wait_for(ann.queue("start").get(), HANG_GUARD)
                        await asyncio.wait_for(task.running.wait(), HANG_GUARD)
                        for i in range(per_task):
                            begin = time.perf_counter()
                            record = mail.queue(task, f"message {i}", False)
                            await asyncio.wait_for(record.received.wait(), HANG_GUARD)
                            times.append(time.perf_counter() - begin)
        finally:
            ann.close()
    return times


async def measure_store_start(rounds: int, chunks: int) -> dict[str, list[float]]:
    """Durations of the ``task_start`` tool call with and without a store, alternating."""
    durations: dict[str, list[float]] = {"store": [], "memory": []}
    with tempfile.TemporaryDirectory(prefix="zett-bench-") as tmp:
        ann = Announcements(tmp, asyncio.get_running_loop())
        try:
            starter = profile("starter", AnnouncingChild(ann.path))
            async with (
                AsyncSubAgentExtension([starter], max_retained=10_000) as memory,
                AsyncSubAgentExtension(
                    [starter], max_retained=10_000, store=os.path.join(tmp, "tasks.sqlite")
                ) as stored,
            ):
                pairs = (("memory", memory), ("store", stored))
                for chunk in range(chunks + 1):  # the first chunk warms both up, unmeasured
                    for name, extension in pairs:
                        timing = Timing()
                        n = max(1, rounds // chunks)
                        await run_parent(
                            extension, timing, [*start_and_read("starter") * n, final()]
                        )
                        for _ in range(n):
                            await asyncio.wait_for(ann.queue("start").get(), HANG_GUARD)
                        if chunk:
                            durations[name] += [e - b for b, e in timing.of("task_start")]
        finally:
            ann.close()
    return durations


async def bench_talk(quick: bool, ray: bool = False) -> None:
    environment(quick, " --talk --ray" if ray else " --talk")
    tasks, per_task = (2, 25) if quick else (3, 100)
    variants = (*VARIANTS, "ray") if ray else VARIANTS
    messages = {v: await measure_message(v, tasks, per_task) for v in variants}
    n_start = 50 if quick else 300
    store = await measure_store_start(n_start, chunks=5)
    n = tasks * per_task
    print("\nTalking to running children (issue 17)\n")
    row("measurement", "process", "in-process", "ray" if ray else "")
    rule()
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        row(
            f"(6) task_message -> in the child, {label} (n={n})",
            ms(pct(messages["process"], q)),
            ms(pct(messages["in-process"], q)),
            ms(pct(messages["ray"], q)) if ray else "",
        )
    print()
    row("measurement", "store", "memory", "added")
    rule()
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        ours, base = pct(store["store"], q), pct(store["memory"], q)
        row(f"(7) task_start tool call, {label} (n={n_start})", ms(ours), ms(base), ms(ours - base))
    print(
        "\ntargets (issue 17): (6) at most 5 ms at p50 (a round trip here: the child's "
        "message_received event back to the parent); (7) the store adds at most 1 ms at p50"
    )
    check_leftovers()


# -- (2) task_cancel -> gone ---------------------------------------------------------------------


def cancel_program(
    ann: Announcements, timing: Timing, rounds: int
) -> tuple[list[Step], list[AgentTool]]:
    async def until_spinning() -> str:
        pid, _ = await ann.queue("spin").get()
        timing.spinning_pid = pid
        return str(pid)

    waiter = AgentTool(
        "until_spinning",
        "Wait until the child spins.",
        {"type": "object", "properties": {}},
        until_spinning,
    )
    steps: list[Step] = []
    for _ in range(rounds):
        steps += [
            turn(call("task_start", subagent_type="spinner", description="spin", prompt="go")),
            lambda r: turn(call("until_spinning")),
            lambda r: turn(call("task_cancel", task_id=_started_id(r))),
        ]
    return [*steps, final()], [waiter]


def _started_id(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if isinstance(message, ToolMessage) and message.name == "task_start":
            task_id: str = json.loads(message.text)["task_id"]
            return task_id
    raise RuntimeError("no task_start result in the parent's history")


async def measure_cancel_process(rounds: int, variant: str = "process") -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    timing = Timing()
    with tempfile.TemporaryDirectory(prefix="zett-bench-") as tmp:
        ann = Announcements(tmp, loop)
        try:
            spinner = profile(
                "spinner", AnnouncingChild(ann.path, [("spin", {"fifo": ann.path})]), [SPIN]
            )
            statuses: list[str] = []
            async with make_extension(variant, [spinner]) as extension:
                steps, tools = cancel_program(ann, timing, rounds)

                async def read() -> None:
                    statuses.extend(t.status.value for t in extension.tasks("parent"))

                await run_parent(extension, timing, steps, tools, then=read)
        finally:
            ann.close()
    if set(statuses) != {"cancelled"} or not all(timing.gone_after_cancel):
        raise RuntimeError(f"cancel did not kill: {statuses} {timing.gone_after_cancel}")
    return {"cancel": [end - begin for begin, end in timing.of("task_cancel")]}


async def probe_inprocess_cancel(directory: str) -> None:
    """Run in a separate Python process: the baseline's cancel program, printing progress.

    Prints ``spin``, then ``cancel-called`` / ``cancel-returned`` when the parent's
    ``task_cancel`` runs, and ``external-cancel-ran`` when a cancel scheduled with
    ``call_soon_threadsafe`` from the reader thread runs. With a spinning in-process child only
    ``spin`` ever appears; the benchmark kills this process after its guard.
    """
    loop = asyncio.get_running_loop()
    extension: AsyncSubAgentExtension
    cancels: list[asyncio.Task[Any]] = []

    def say(text: str) -> None:
        print(f"{text} {time.perf_counter()!r}", flush=True)

    def external_cancel() -> None:
        say("external-cancel-ran")
        for task in extension.tasks("parent"):
            cancels.append(loop.create_task(extension.cancel(task)))

    def on_line(kind: str, pid: int, stamp: float) -> None:
        if kind == "spin":
            say("spin")
            loop.call_soon_threadsafe(external_cancel)

    class Loud(Timing):
        async def on_tool_call(
            self, context: AgentRunContext, call: ToolCall, call_next: ToolCallNext
        ) -> ToolResult:
            if call.name == "task_cancel":
                say("cancel-called")
            result = await super().on_tool_call(context, call, call_next)
            if call.name == "task_cancel":
                say("cancel-returned")
            return result

    ann = Announcements(directory, loop, on_line)
    timing = Loud()
    spinner = profile("spinner", AnnouncingChild(ann.path, [("spin", {"fifo": ann.path})]), [SPIN])
    async with make_extension("in-process", [spinner]) as extension:
        steps, tools = cancel_program(ann, timing, 1)
        await run_parent(extension, timing, steps, tools)
    ann.close()


async def measure_cancel_inprocess(guard: float) -> dict[str, Any]:
    """Run the baseline's cancel program in a child Python process under a hang guard."""
    tmp = tempfile.mkdtemp(prefix="zett-bench-")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        "--probe-inprocess-cancel",
        tmp,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HANG_GUARD):  # until its child spins
                while "spin" not in seen:
                    line = await proc.stdout.readline()
                    if not line:
                        raise RuntimeError("the in-process cancel probe exited early")
                    word, stamp = line.decode().split()
                    seen[word] = float(stamp)
            async with asyncio.timeout(guard):  # then give the cancel every chance
                while line := await proc.stdout.readline():
                    word, stamp = line.decode().split()
                    seen[word] = float(stamp)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"seen": seen, "guard": guard}


# -- (3) + (4) CPU-bound children and the parent's loop stall ------------------------------------


def calibrate(seconds: float) -> int:
    """SHA-256 rounds that take about ``seconds`` of CPU in this process."""
    rounds = 20_000
    while True:
        begin = time.perf_counter()
        burn(rounds)
        took = time.perf_counter() - begin
        if took >= 0.1:
            return max(1, int(rounds * seconds / took))
        rounds *= 4


async def ticker(lateness: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        begin = time.perf_counter()
        await asyncio.sleep(TICK)
        lateness.append(time.perf_counter() - begin - TICK)


async def measure_cpu(k: int, rounds: int, repeats: int) -> dict[str, dict[str, Any]]:
    """Each repeat runs the sequential reference and both variants, in a rotating order."""
    loop = asyncio.get_running_loop()
    results: dict[str, dict[str, Any]] = {
        v: {"wall": [], "stall": [], "cpu": []} for v in (*VARIANTS, "sequential", "raw")
    }

    async def variant_run(variant: str, extension: AsyncSubAgentExtension) -> None:
        steps: list[Step] = [
            turn(
                *(
                    call("task_start", subagent_type="burner", description=f"b{i}", prompt="go")
                    for i in range(k)
                )
            ),
            lambda r: turn(
                *(
                    call("task_output", task_id=t.task_id, wait_seconds=120)
                    for t in extension.tasks("parent")
                    if not t.done()
                )
            ),
            final(),
        ]
        stop = asyncio.Event()
        ticks = loop.create_task(ticker(results[variant]["stall"], stop))
        await asyncio.sleep(0)
        cpu_begin, begin = time.process_time(), time.perf_counter()
        statuses: set[str] = set()

        async def read() -> None:
            results[variant]["wall"].append(time.perf_counter() - begin)
            burners = extension.tasks("parent")
            statuses.update(t.status.value for t in burners)
            if variant != "in-process":  # the children's own CPU time, as the extension saw it
                results[variant]["cpu"].append(sum(t.cpu_seconds for t in burners))
            else:  # everything ran in this process
                results[variant]["cpu"].append(time.process_time() - cpu_begin)

        await run_parent(extension, Timing(), steps, then=read)
        stop.set()
        await ticks
        if statuses != {"completed"}:
            raise RuntimeError(f"{variant}: burners ended {statuses}")

    def sequential() -> None:
        cpu_begin, begin = time.process_time(), time.perf_counter()
        for _ in range(k):
            burn(rounds)
        results["sequential"]["wall"].append(time.perf_counter() - begin)
        results["sequential"]["cpu"].append(time.process_time() - cpu_begin)

    async def raw_parallel() -> None:
        # The machine's ceiling: K bare interpreters doing the same work at once, no agents.
        begin = time.perf_counter()
        procs = [
            await asyncio.create_subprocess_exec(sys.executable, "-c", RAW_BURN, str(rounds))
            for _ in range(k)
        ]
        for proc in procs:
            await proc.wait()
        results["raw"]["wall"].append(time.perf_counter() - begin)

    with tempfile.TemporaryDirectory(prefix="zett-bench-") as tmp:
        ann = Announcements(tmp, loop)
        try:
            burner = profile(
                "burner", AnnouncingChild(ann.path, [("burn", {"rounds": rounds})]), [BURN]
            )
            warm = profile("warm", AnnouncingChild(ann.path))
            options = {"max_concurrent": k, "max_children": k}
            async with contextlib.AsyncExitStack() as stack:
                extensions = {
                    v: await stack.enter_async_context(make_extension(v, [burner, warm], **options))
                    for v in VARIANTS
                }
                warm_k: list[Step] = [
                    turn(
                        *(
                            call(
                                "task_start", subagent_type="warm", description=f"w{i}", prompt="go"
                            )
                            for i in range(k)
                        )
                    ),
                    lambda r: turn(
                        *(
                            call("task_output", task_id=f"task-{i}", wait_seconds=120)
                            for i in range(1, k + 1)
                        )
                    ),
                    final(),
                ]
                for extension in extensions.values():
                    # k children at once: k workers have imported the child runtime (a Ray
                    # worker imports it on its first child)
                    await run_parent(extension, Timing(), warm_k)
                order = ["sequential", "raw", *VARIANTS]
                for i in range(repeats):
                    for name in order[i % 4 :] + order[: i % 4]:
                        if name == "sequential":
                            sequential()
                        elif name == "raw":
                            await raw_parallel()
                        else:
                            await variant_run(name, extensions[name])
        finally:
            ann.close()
    return results


# -- (5) N children on the real model adapter: time until all run, memory per child ----------


class HoldingEndpoint:
    """An OpenAI-compatible endpoint on loopback, in a process of its own (``_holding_endpoint``).

    It reads each request and then holds the response open until it is closed, so a child that
    reached it stays "running" (waiting on its model, as real children mostly are). Each
    arrival is stamped there with ``perf_counter`` and reported to ``queue`` (a queue of the
    benchmark's loop). Until 2026-12-06 it ran in a thread of the benchmark's process, whose
    parent then shared its CPU and its GIL with the endpoint (about 1 s of CPU for 1,000
    requests): a provider does not run in the parent.
    """

    def __init__(self, queue: asyncio.Queue[float], loop: asyncio.AbstractEventLoop) -> None:
        self._queue = queue
        self._loop = loop
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_holding_endpoint.py")
        self._proc = subprocess.Popen(
            [sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        assert self._proc.stdout is not None and self._proc.stdin is not None
        self._out = self._proc.stdout.fileno()
        port = b""
        while not port.endswith(b"\n"):
            byte = os.read(self._out, 1)  # its port, alone on the first line
            if not byte:
                raise RuntimeError("the holding endpoint ended before it listened")
            port += byte
        self.port = int(port)
        self._buffer = b""
        os.set_blocking(self._out, False)
        loop.add_reader(self._out, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._out, 65536)
        except BlockingIOError:
            return
        if not data:
            self._loop.remove_reader(self._out)
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            self._queue.put_nowait(float(line))

    def close(self) -> None:
        self._loop.remove_reader(self._out)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        self._proc.wait(HANG_GUARD)
        self._proc.stdout.close()


def uss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_full_info().uss) / 2**20


async def measure_running(
    n: int,
    repeats: int,
    variants: Sequence[str] = ("process", "process, no preload", "in-process"),
) -> dict[str, dict[str, list[float]]]:
    """``n`` children whose model is ``OpenAIChatModel`` start in one parent turn; each then
    waits on the endpoint. Time from the turn's start until the endpoint received all ``n``
    requests, and unique memory (USS) per running child. ``process`` children are brokered (the
    default); ``process, direct`` ones call the endpoint themselves (``broker=False``)."""
    from zett_agent.models.openai import OpenAIChatModel
    from zett_agent.runners import ProcessRunner

    loop = asyncio.get_running_loop()
    results: dict[str, dict[str, list[float]]] = {v: {"time": [], "uss": []} for v in variants}
    arrivals: asyncio.Queue[float] = asyncio.Queue()
    endpoint = HoldingEndpoint(arrivals, loop)
    try:
        model = OpenAIChatModel(
            "bench", base_url=f"http://127.0.0.1:{endpoint.port}/v1", api_key="none", timeout=600
        )
        remote = profile("remote", model)
        for repeat in range(repeats):
            turn_ = repeat % len(variants)
            for variant in (*variants[turn_:], *variants[:turn_]):
                if variant == "in-process":
                    extension = make_extension("in-process", [remote], max_concurrent=n)
                else:
                    preload = () if variant == "process, no preload" else None
                    broker = variant != "process, direct"
                    runner = ProcessRunner(max_children=n, preload=preload, broker=broker)
                    extension = AsyncSubAgentExtension([remote], max_concurrent=n, runner=runner)
                async with extension:
                    # a request with no task boots the pool (with its preload) before the clock
                    await run_parent(extension, Timing(), [final()])
                    if isinstance(extension.runner, ProcessRunner):
                        warming = runner_warming(extension.runner)
                        if warming is not None:
                            await warming
                    gc_uss = uss_mib(os.getpid())
                    steps: list[Step] = [
                        turn(
                            *(
                                call(
                                    "task_start",
                                    subagent_type="remote",
                                    description=f"r{i}",
                                    prompt="hello",
                                )
                                for i in range(n)
                            )
                        ),
                        final(),
                    ]
                    begin = time.perf_counter()

                    async def measure(
                        variant: str = variant,
                        extension: Any = extension,
                        begin: float = begin,
                        gc_uss: float = gc_uss,
                    ) -> None:
                        last = begin
                        for _ in range(n):
                            try:
                                last = await asyncio.wait_for(arrivals.get(), HANG_GUARD)
                            except TimeoutError:
                                states = [
                                    (t.status.value, t.error) for t in extension.tasks("parent")
                                ]
                                raise RuntimeError(f"{variant}: stuck: {states[:5]}") from None
                        results[variant]["time"].append(last - begin)
                        tasks = extension.tasks("parent")
                        if variant == "in-process":
                            results[variant]["uss"].append((uss_mib(os.getpid()) - gc_uss) / n)
                        else:
                            pids = [t.job.pid for t in tasks if t.job is not None and t.job.pid]
                            if len(pids) != n:
                                raise RuntimeError(f"{variant}: {len(pids)} of {n} running")
                            results[variant]["uss"].append(statistics.median(map(uss_mib, pids)))
                        if any(t.done() for t in tasks):
                            raise RuntimeError(f"{variant}: a child ended: {tasks[0].error}")

                    await run_parent(extension, Timing(), steps, then=measure)
    finally:
        endpoint.close()
    return results


# -- report ----------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1e3:.3f} ms"


def row(name: str, ours: str, base: str, ratio: str) -> None:
    print(f"| {name:<52} | {ours:>13} | {base:>30} | {ratio:>7} |")


def rule() -> None:
    print(f"|{'-' * 54}|{'-' * 14}:|{'-' * 31}:|{'-' * 8}:|")


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def environment(quick: bool, extra: str = "") -> None:
    clock = time.get_clock_info("perf_counter").implementation
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = f"benchmarks/bench_subagents.py{extra}{' --quick' if quick else ''}"
    print(f"command: uv run python {command}")
    print(
        f"environment: {platform.system()} {platform.release()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs ({usable} usable), "
        f"{platform.python_implementation()} {platform.python_version()}, asyncio, "
        f"perf_counter = {clock}"
    )
    print(f"load average before: {load()}")


def report_running(running: dict[str, dict[str, list[float]]], n: int, repeats: int) -> None:
    def ratio(ours: float, base: float) -> str:
        return f"{base / ours:.2f}" if ours > 0 else "inf"

    p, b, cold = running["process"], running["in-process"], running["process, no preload"]
    t_p, t_b, t_c = (statistics.median(v["time"]) for v in (p, b, cold))
    m_p, m_b, m_c = (statistics.median(v["uss"]) for v in (p, b, cold))
    row(
        f"(5) {n} children on OpenAIChatModel: all running",
        f"{t_p:.3f} s",
        f"{t_b:.3f} s",
        ratio(t_p, t_b),
    )
    row("    same, without preload (each child imports them)", f"{t_c:.3f} s", "", "")
    row(
        "    unique memory (USS) per running child",
        f"{m_p:.2f} MiB",
        f"{m_b:.2f} MiB",
        ratio(m_p, m_b),
    )
    row("    same, without preload", f"{m_c:.2f} MiB", "", "")
    print(f"\n(5) medians of {repeats} runs; in-process memory: the parent's USS growth / {n}.")
    print(
        "    targets (issue 10): <= 5 MiB per running child, 100 children running within 2 s: "
        f"{'met' if m_p <= 5 else 'NOT met'} / "
        f"{'met' if n < 100 or t_p <= 2 else 'NOT met'}"
    )


async def bench_running(quick: bool, n: int) -> None:
    environment(quick)
    repeats = 1 if quick else 3
    started = time.perf_counter()
    running = await measure_running(n, repeats)
    print(f"\n(5) only, {time.perf_counter() - started:.1f} s\n")
    row("measurement", "process", "in-process", "ratio")
    rule()
    report_running(running, n, repeats)
    check_leftovers()


def check_leftovers() -> None:
    print(f"load average after: {load()}")
    left = psutil.Process().children(recursive=True)
    print(f"processes left behind: {len(left)}")
    if left:
        raise SystemExit(f"the benchmark left processes behind: {left}")


def _wait_forever() -> None:
    from zett_agent.process import emit

    emit("running")
    time.sleep(3600)


async def measure_cancel_waiting(variant: str, n: int = 50) -> dict[str, float]:
    """(6): ``n`` children, most waiting for a CPU, cancelled at once; the parent's stall."""
    cpus = os.cpu_count() or 2
    if variant == "ray":
        from zett_agent.runners.ray import RayRunner

        runner: Any = RayRunner(RAY_ADDRESS)
        submit = runner.submit_function
        close = runner.close
    else:
        runner = ProcessPool(cpus)
        await runner.start()

        async def submit(fn: Callable[..., Any]) -> Any:
            return runner.submit(fn)

        close = runner.close
    try:
        jobs = [await submit(_wait_forever) for _ in range(n)]
        running = jobs[: min(cpus, n)]
        await asyncio.wait_for(asyncio.gather(*(anext(j.events()) for j in running)), HANG_GUARD)
        lateness: list[float] = []
        stop = asyncio.Event()
        ticks = asyncio.get_running_loop().create_task(ticker(lateness, stop))
        await asyncio.sleep(TICK * 4)  # a few ticks before, as a reference
        begin = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(job.cancel() for job in jobs)), HANG_GUARD)
        took = time.perf_counter() - begin
        stop.set()
        await ticks
    finally:
        await close()
    return {"stall": max(lateness), "took": took}


def _bare_start(fifo: str) -> Iterator[int]:
    """A bare Ray task: says it runs (the child's first model call's counterpart), ends."""
    announce(fifo, "bare")
    yield 1


def _bare_spin(fifo: str) -> Iterator[int]:
    """A bare Ray task that says it runs, then spins until it is killed."""
    announce(fifo, "barespin")
    yield 1
    while True:
        pass


def _bare_request(port: int) -> Iterator[int]:
    """A bare Ray task that waits on a model: one request to the holding endpoint, held open."""
    import socket

    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )
    yield os.getpid()
    conn.recv(1)  # until the endpoint closes or the task is killed


async def _gone(pid: int) -> None:
    """Return once process ``pid`` has exited (its pidfd is readable); at once if it has."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
    try:
        await asyncio.wait_for(readable, HANG_GUARD)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def measure_bare_ray(n_start: int, n_cancel: int) -> dict[str, list[float]]:
    """Issue 34's Ray yardsticks: a bare Ray generator task's start (submit -> its body runs,
    stamped in the task as the children stamp their first model call) and a bare task's
    ``ray.cancel(force=True)`` -> its process gone. The same Ray as the children's."""
    import ray

    start_task = ray.remote(num_cpus=1, max_retries=0)(_bare_start)
    spin_task = ray.remote(num_cpus=1, max_retries=0)(_bare_spin)
    out: dict[str, list[float]] = {"start": [], "cancel": []}
    with tempfile.TemporaryDirectory(prefix="zett-bench-") as tmp:
        ann = Announcements(tmp, asyncio.get_running_loop())
        try:
            for n in range(n_start + 2):  # two to warm up, as the children's warm extension
                begin = time.perf_counter()
                stream = start_task.options(num_returns="streaming").remote(ann.path)
                _, stamp = await asyncio.wait_for(ann.queue("bare").get(), HANG_GUARD)
                async for _ in stream:
                    pass
                if n >= 2:
                    out["start"].append(stamp - begin)
            for _ in range(n_cancel):
                stream = spin_task.options(num_returns="streaming").remote(ann.path)
                pid, _ = await asyncio.wait_for(ann.queue("barespin").get(), HANG_GUARD)
                begin = time.perf_counter()
                ray.cancel(stream, force=True)
                await _gone(pid)
                out["cancel"].append(time.perf_counter() - begin)
        finally:
            ann.close()
    return out


async def measure_all_running(variant: str, n: int = 50) -> float:
    """Issue 34's third Ray yardstick: ``n`` children that wait on their model, started in one
    parent turn, each asking for so little CPU that all may run at once (each in a Ray worker of
    its own, which Ray starts as they come): seconds until the endpoint holds all ``n`` requests.
    ``variant``: "ray" (child agents of ``AsyncSubAgentExtension`` on ``RayRunner``, brokered:
    their Ray tasks make the calls) or "bare ray" (bare Ray tasks that each send one request,
    then ``ray.cancel(force=True)``)."""
    import ray

    from zett_agent.models.openai import OpenAIChatModel
    from zett_agent.runners.ray import RayRunner

    cpus = 0.5 / n  # n of them fit on one CPU
    loop = asyncio.get_running_loop()
    arrivals: asyncio.Queue[float] = asyncio.Queue()
    endpoint = HoldingEndpoint(arrivals, loop)
    took = 0.0

    async def all_arrived(begin: float) -> float:
        last = begin
        for _ in range(n):
            last = await asyncio.wait_for(arrivals.get(), HANG_GUARD * 3)
        return last - begin

    try:
        if variant == "bare ray":
            task = ray.remote(num_cpus=cpus, max_retries=0)(_bare_request)
            begin = time.perf_counter()
            streams = [
                task.options(num_returns="streaming").remote(endpoint.port) for _ in range(n)
            ]
            took = await all_arrived(begin)
            pids = [await (await stream.__anext__()) for stream in streams]
            for stream in streams:
                ray.cancel(stream, force=True)
            await asyncio.gather(*(_gone(pid) for pid in pids))
            return took
        model = OpenAIChatModel(
            "bench", base_url=f"http://127.0.0.1:{endpoint.port}/v1", api_key="none", timeout=600
        )
        runner = RayRunner(RAY_ADDRESS, num_cpus=cpus)
        extension = AsyncSubAgentExtension(
            [profile("remote", model)], max_concurrent=n, runner=runner
        )
        async with extension:
            starts = [
                call("task_start", subagent_type="remote", description=f"r{i}", prompt="hello")
                for i in range(n)
            ]
            begin = time.perf_counter()

            async def measure() -> None:
                nonlocal took
                took = await all_arrived(begin)

            await run_parent(extension, Timing(), [turn(*starts), final()], then=measure)
    finally:
        endpoint.close()
    return took


async def bench_ray(quick: bool) -> None:
    """(1)-(4) for processes, Ray and the in-process baseline, side by side."""
    import ray

    from zett_agent.runners.ray import RayRunner

    global VARIANTS
    VARIANTS = ("process", "ray", "in-process")
    n_start = 50 if quick else 200
    n_cancel = 5 if quick else 20
    seconds = 0.3 if quick else 1.0
    repeats = 1 if quick else 3
    k = min(4, max(2, os.cpu_count() or 2))

    environment(quick, f" --ray{' ' + RAY_ADDRESS if RAY_ADDRESS else ''}")
    begin = time.perf_counter()
    RayRunner(RAY_ADDRESS).connect()  # a local Ray starts here, before any clock
    print(f"Ray {ray.__version__} connected in {time.perf_counter() - begin:.1f} s")
    try:
        started = time.perf_counter()
        start = await measure_start(n_start, chunks=5)
        cancel = {v: await measure_cancel_process(n_cancel, v) for v in ("process", "ray")}
        rounds = calibrate(seconds)
        cpu = await measure_cpu(k, rounds, repeats)
        waiting = {v: await measure_cancel_waiting(v) for v in ("process", "ray")}
        bare = await measure_bare_ray(n_start, n_cancel)
        all_running = {v: await measure_all_running(v) for v in ("bare ray", "ray")}
        total = time.perf_counter() - started
    finally:
        ray.shutdown()

    print(
        f"\nAsyncSubAgentExtension on three runners, {'quick' if quick else 'full'} run, "
        f"{total:.1f} s\n"
    )
    print(f"| {'measurement':<52} | {'process':>13} | {'ray':>13} | {'in-process':>13} |")
    print(f"|{'-' * 54}|{'-' * 14}:|{'-' * 14}:|{'-' * 14}:|")

    def line(name: str, *values: str) -> None:
        print(f"| {name:<52} | " + " | ".join(f"{v:>13}" for v in values) + " |")

    for q, label in ((0.5, "p50"), (0.99, "p99")):
        line(
            f"(1) task_start -> child running, {label} (n={n_start})",
            *(ms(pct(start[v]["start"], q)) for v in VARIANTS),
        )
    line("    first start (cold)", *(ms(start[v]["cold"]) for v in VARIANTS))
    line(
        "    task_start -> report read (task_output), p50",
        *(ms(pct(start[v]["round"], 0.5)) for v in VARIANTS),
    )
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        line(
            f"(2) task_cancel -> tree gone, spinning child, {label} (n={n_cancel})",
            ms(pct(cancel["process"]["cancel"], q)),
            ms(pct(cancel["ray"]["cancel"], q)),
            "never",
        )
    walls = {v: statistics.median(cpu[v]["wall"]) for v in VARIANTS}
    seq = statistics.median(cpu["sequential"]["wall"])
    line(
        f"(3) {k} CPU-bound children x {seconds:g} s, wall (median of {repeats})",
        *(f"{walls[v]:.3f} s" for v in VARIANTS),
    )
    line(
        "    speedup vs the same work run sequentially",
        *(f"{seq / walls[v]:.2f} x" for v in VARIANTS),
    )
    raw = statistics.median(cpu["raw"]["wall"])
    line(f"    ceiling: {k} bare processes at once", *([f"{seq / raw:.2f} x"] * 3))
    for q, label in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
        line(
            f"(4) parent loop stall during (3), {label}",
            *(ms(pct(cpu[v]["stall"], q)) for v in VARIANTS),
        )
    line(
        "(6) cancel 50 waiting children: parent loop stall, max",
        ms(waiting["process"]["stall"]),
        ms(waiting["ray"]["stall"]),
        "-",
    )
    line(
        "    the 50 cancels, wall",
        ms(waiting["process"]["took"]),
        ms(waiting["ray"]["took"]),
        "-",
    )
    print(
        "\n(2) in-process: the child spins inside the parent's only thread, so the parent's "
        "task_cancel never runs (see the run without --ray)."
    )
    print("\nRay children against bare Ray tasks in the same Ray (issue 34, target 6)\n")
    print(f"| {'measurement':<52} | {'ray':>10} | {'bare ray':>10} | {'ratio':>6} | target |")
    print(f"|{'-' * 54}|{'-' * 11}:|{'-' * 11}:|{'-' * 7}:|--------|")
    yardsticks = (
        (f"start p50 (n={n_start})", pct(start["ray"]["start"], 0.5), pct(bare["start"], 0.5)),
        (
            f"cancel -> gone p50 (n={n_cancel}; bare: force)",
            pct(cancel["ray"]["cancel"], 0.5),
            pct(bare["cancel"], 0.5),
        ),
        (
            "50 waiting on a model: all running",
            all_running["ray"],
            all_running["bare ray"],
        ),
    )
    for name, ours, theirs in yardsticks:
        shown = ms(ours) if ours < 1 else f"{ours:.2f} s"
        their = ms(theirs) if theirs < 1 else f"{theirs:.2f} s"
        ratio = ours / theirs
        print(
            f"| {name:<52} | {shown:>10} | {their:>10} | {ratio:>6.2f} | "
            f"{'met' if ratio <= 2 else 'NOT met':>6} |"
        )
    print(
        "\nbare: a Ray generator task that stamps its start; a spinning one killed with "
        "ray.cancel(force=True) until its process is gone; 50 tasks of 0.01 CPU that each "
        "send one request to the endpoint the children wait on. "
        "Target: each ratio <= 2."
    )
    check_leftovers()


async def bench(quick: bool, n_running: int) -> None:
    n_start = 50 if quick else 300
    n_cancel = 5 if quick else 30
    guard = 2.0 if quick else 5.0
    seconds = 0.3 if quick else 1.0
    repeats = 1 if quick else 3
    k = min(4, max(2, os.cpu_count() or 2))

    environment(quick)
    if not time.get_clock_info("perf_counter").implementation.startswith(
        "clock_gettime(CLOCK_MONOTONIC"
    ):
        print("warning: perf_counter may not be one clock across processes; (1) is unreliable")
    started = time.perf_counter()
    start = await measure_start(n_start, chunks=5)
    cancel = await measure_cancel_process(n_cancel)
    probe = await measure_cancel_inprocess(guard)
    rounds = calibrate(seconds)
    cpu = await measure_cpu(k, rounds, repeats)
    running = await measure_running(n_running, repeats)
    total = time.perf_counter() - started

    def ratio(ours: float, base: float) -> str:
        if ours <= 0:
            return "inf"
        value = base / ours
        return f"{value:.0f}" if value >= 100 else f"{value:.2f}"

    print(
        f"\nAsyncSubAgentExtension (a process per child) vs in-process baseline (asyncio tasks), "
        f"{'quick' if quick else 'full'} run, {total:.1f} s; ratio = in-process / process "
        "(> 1: the process version is faster)\n"
    )
    row("measurement", "process", "in-process", "ratio")
    rule()
    p, b = start["process"], start["in-process"]
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        ours, base = pct(p["start"], q), pct(b["start"], q)
        row(
            f"(1) task_start -> child running, {label} (n={n_start})",
            ms(ours),
            ms(base),
            ratio(ours, base),
        )
    row(
        "    first start (cold; the pool boots)",
        ms(p["cold"]),
        ms(b["cold"]),
        ratio(p["cold"], b["cold"]),
    )
    ours, base = pct(p["round"], 0.5), pct(b["round"], 0.5)
    row("    task_start -> report read (task_output), p50", ms(ours), ms(base), ratio(ours, base))

    seen = probe["seen"]
    if "cancel-returned" in seen:
        base_cancel = ms(seen["cancel-returned"] - seen["cancel-called"])
    else:
        base_cancel = "never: parent loop blocked"
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        row(
            f"(2) task_cancel -> pid gone, spinning child, {label}",
            ms(pct(cancel["cancel"], q)),
            base_cancel,
            "inf" if "never" in base_cancel else "",
        )
    called = "ran" if "cancel-called" in seen else f"never ran in {probe['guard']:g} s"
    external = "ran" if "external-cancel-ran" in seen else f"never ran in {probe['guard']:g} s"
    row("    the parent's task_cancel call", "ran", called, "")
    row("    a cancel scheduled from another thread", "n/a", external, "")

    walls = {v: statistics.median(cpu[v]["wall"]) for v in VARIANTS}
    seq = statistics.median(cpu["sequential"]["wall"])
    label = f"(3) {k} CPU-bound children x {seconds:g} s, wall (median of {repeats})"
    row(
        label,
        f"{walls['process']:.3f} s",
        f"{walls['in-process']:.3f} s",
        ratio(walls["process"], walls["in-process"]),
    )
    raw = statistics.median(cpu["raw"]["wall"])
    row("    same work run sequentially, no agents", f"{seq:.3f} s", f"{seq:.3f} s", "")
    row(
        "    speedup vs sequential",
        f"{seq / walls['process']:.2f} x",
        f"{seq / walls['in-process']:.2f} x",
        "",
    )
    row(
        f"    ceiling: {k} bare processes at once ({raw:.3f} s)",
        f"{seq / raw:.2f} x",
        f"{seq / raw:.2f} x",
        "",
    )
    parallel = {v: sum(cpu[v]["cpu"]) / sum(cpu[v]["wall"]) for v in (*VARIANTS, "sequential")}
    row(
        f"    CPU s used / wall s (sequential: {parallel['sequential']:.2f})",
        f"{parallel['process']:.2f}",
        f"{parallel['in-process']:.2f}",
        "",
    )
    for q, label in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
        ours, base = pct(cpu["process"]["stall"], q), pct(cpu["in-process"]["stall"], q)
        row(f"(4) parent loop stall during (3), {label}", ms(ours), ms(base), ratio(ours, base))
    blocked = {
        v: sum(x for x in cpu[v]["stall"] if x > 0.010) / sum(cpu[v]["wall"]) for v in VARIANTS
    }
    row(
        "    time the loop was stalled > 10 ms, share of wall",
        f"{blocked['process']:.1%}",
        f"{blocked['in-process']:.1%}",
        "",
    )
    ticks = {v: len(cpu[v]["stall"]) for v in VARIANTS}
    row(
        f"    ticker wakeups ({TICK * 1e3:g} ms sleeps)",
        str(ticks["process"]),
        str(ticks["in-process"]),
        "",
    )

    report_running(running, n_running, repeats)

    print(
        f"\n(2) in-process: the child spins inside the parent's only thread, so the parent's"
        f" task_cancel never runs; the probe process was killed after {probe['guard']:g} s."
    )
    check_leftovers()


async def bench_sandbox(quick: bool) -> None:
    """(1) with and without a ``Sandbox`` around each child, side by side: what the sandbox
    adds to ``task_start -> child running`` (its policy is built in the parent, enforced in the
    child's fresh worker before the child's code is unpickled)."""
    n = 50 if quick else 300
    environment(quick, " --sandbox")
    variants: dict[str, Factory] = {
        "process": lambda d, tmp: AsyncSubAgentExtension([d]),
        # the child announces itself through a FIFO in the benchmark's directory
        "sandboxed": lambda d, tmp: AsyncSubAgentExtension([d], sandbox=Sandbox(write=[tmp])),
    }
    start = await measure_start(n, chunks=5, variants=variants)
    print("\n(1) task_start -> child running, with and without a sandbox\n")
    row("measurement", "sandboxed", "process", "added")
    rule()
    s, p = start["sandboxed"], start["process"]
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        ours, base = pct(s["start"], q), pct(p["start"], q)
        row(f"task_start -> child running, {label} (n={n})", ms(ours), ms(base), ms(ours - base))
    ours, base = pct(s["round"], 0.5), pct(p["round"], 0.5)
    row("task_start -> report read (task_output), p50", ms(ours), ms(base), ms(ours - base))
    row("first start (cold; the pool boots)", ms(s["cold"]), ms(p["cold"]), "")
    print("\ntarget (issue 16): the sandbox adds at most 2 ms at p50")
    check_leftovers()


async def bench_first(repeats: int) -> None:
    """The first ``task_start`` right after entering a new extension, ``repeats`` times: each
    time a new extension (a new pool, which starts in the background when entered), its
    in-process baseline beside it."""
    environment(False, f" --first {repeats}")
    cold: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for variant, got in (await measure_start(1, chunks=1)).items():
            cold[variant].append(got["cold"])
    print(f"\nfirst task_start -> child running, right after entering, {repeats} times\n")
    row("measurement", *VARIANTS, "ratio")  # in-process / process, as in the main table
    rule()
    p, b = cold["process"], cold["in-process"]
    for q, label in ((0.5, "p50"), (0.0, "min"), (1.0, "max")):
        row(
            f"first start (the pool boots), {label}",
            ms(pct(p, q)),
            ms(pct(b, q)),
            f"{pct(b, q) / pct(p, q):.2f}",
        )
    met = sum(value <= 0.1 for value in p)
    print(f"\ntarget (issue 34): <= 100 ms; met in {met} of {repeats}")
    print("process, each: " + ", ".join(f"{value * 1000:.1f}" for value in p) + " ms")
    check_leftovers()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (< 40 s)")
    parser.add_argument(
        "--children", type=int, default=100, help="children of measurement (5) (default 100)"
    )
    parser.add_argument("--running-only", action="store_true", help="run measurement (5) only")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="add RayRunner to (1)-(4) (needs the ray extra; default: a local Ray)",
    )
    parser.add_argument(
        "--sandbox", action="store_true", help="only (1), with and without a Sandbox"
    )
    parser.add_argument(
        "--talk", action="store_true", help="only (6) task_message and (7) the store's cost"
    )
    parser.add_argument(
        "--first", type=int, metavar="N", help="only the first start of N new extensions"
    )
    parser.add_argument("--probe-inprocess-cancel", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first:
        asyncio.run(bench_first(args.first))
    elif args.sandbox:
        asyncio.run(bench_sandbox(args.quick))
    elif args.talk:
        global RAY_ADDRESS
        RAY_ADDRESS = args.ray or None
        asyncio.run(bench_talk(args.quick, ray=args.ray is not None))
    elif args.probe_inprocess_cancel:
        asyncio.run(probe_inprocess_cancel(args.probe_inprocess_cancel))
    elif args.ray is not None:
        RAY_ADDRESS = args.ray or None
        asyncio.run(bench_ray(args.quick))
    elif args.running_only:
        asyncio.run(bench_running(args.quick, args.children))
    else:
        asyncio.run(bench(args.quick, args.children))


if __name__ == "__main__":
    main()
