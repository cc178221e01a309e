"""Sandboxed child agents: ``SubAgentDefinition(sandbox=...)`` and the extensions' default.

A child's whole process (its model loop and its tools) runs in the sandbox; ``task_info``
says what was enforced; runners that cannot enforce a sandbox fail a required one before the
child starts.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _sandbox_tools import FETCH, READ

from support.calls import call
from support.parent import parent_answer
from support.scripted_models import StepModel, ToolsThenAnswer, tool_results
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition, SubAgentExtension
from zett_agent.messages import AssistantMessage
from zett_agent.process import Egress, ProcessLimits, Sandbox, SandboxUnavailable
from zett_agent.process._sandbox._landlock import abi
from zett_agent.runners import InProcessRunner
from zett_agent.runners._refused import RefusedJob

HANG_GUARD = 60
_ABI, _WHY = abi()
needs_sandbox = pytest.mark.skipif(_ABI < 6, reason=f"Landlock ABI {_ABI} < 6: {_WHY}")


@pytest.fixture
def secret() -> Iterator[Path]:
    path = Path(os.path.expanduser("~")) / f".zett-test-secret-{os.urandom(6).hex()}"
    path.write_text("the host's secret")
    yield path
    path.unlink()


def reader(name: str, path: Path, sandbox: Sandbox | None = None) -> SubAgentDefinition:
    return SubAgentDefinition(
        name,
        "reads a file",
        "p",
        model=ToolsThenAnswer("{last}", tools=[("read_path", {"path": str(path)})]),
        tools=[READ],
        sandbox=sandbox,
    )


def start_and_read(*names: str) -> StepModel:
    """A parent that starts one task per profile at once, then reads each report."""
    starts = [call("task_start", subagent_type=n, description=n, prompt="go") for n in names]
    merged = [c for message in starts for c in message.tool_calls]
    reads = [
        call("task_output", task_id=f"task-{i + 1}", wait_seconds=HANG_GUARD).tool_calls[0]
        for i in range(len(names))
    ]
    return StepModel(
        [
            AssistantMessage(tool_calls=tuple(merged)),
            AssistantMessage(tool_calls=tuple(reads)),
            AssistantMessage("read them"),
        ]
    )


@needs_sandbox
async def test_a_sandboxed_child_cannot_read_outside_and_task_info_says_what_held(
    secret: Path,
) -> None:
    definitions = [
        reader("confined", secret),  # the extension's default sandbox
        reader("open", secret, Sandbox(read=[secret])),  # its own, which may read the file
    ]
    model = start_and_read("confined", "open")
    extension = AsyncSubAgentExtension(definitions, sandbox=Sandbox())
    async with extension, parent_answer(model, extension):
        # read before the client closes: closing it releases the session's entries
        confined, allowed = extension.tasks("parent")
        infos = [extension.task_info(task) for task in (confined, allowed)]
    assert confined.status is SubAgentTaskStatus.COMPLETED, confined.error
    assert (confined.output or "").startswith("denied: Permission denied"), confined.output
    assert (allowed.output or "").startswith("read 17 characters"), allowed.output
    for info in infos:
        entry: dict[str, Any] = info["sandbox"]  # type: ignore[typeddict-item]
        assert entry["landlock_abi"] == _ABI and entry["seccomp"] is True, entry
        assert entry["network"] == "none" and entry["scoped"] and entry["filesystem"], entry
        assert "scratch" not in entry
    # the model read the same entry through task_output
    shown = [json.loads(m.text) for m in tool_results(model.requests[-1])[-2:]]
    assert shown[0]["sandbox"]["landlock_abi"] == _ABI


@needs_sandbox
async def test_the_blocking_subagent_tool_runs_its_child_in_the_sandbox(secret: Path) -> None:
    model = StepModel(
        [
            call("subagent", subagent_type="confined", description="d", prompt="go"),
            lambda request: AssistantMessage(tool_results(request)[-1].text),
        ]
    )
    extension = SubAgentExtension([reader("confined", secret, Sandbox())])
    async with extension, parent_answer(model, extension) as answer:
        assert answer.startswith("denied: Permission denied"), answer


async def test_a_runner_without_sandboxes_fails_a_required_one_before_the_child_starts(
    secret: Path,
) -> None:
    definitions = [
        reader("required", secret, Sandbox()),
        reader("optional", secret, Sandbox(required=False)),
    ]
    model = start_and_read("required", "optional")
    extension = AsyncSubAgentExtension(definitions, runner=InProcessRunner())
    async with extension, parent_answer(model, extension):
        required, optional = extension.tasks("parent")
        infos = [extension.task_info(task) for task in (required, optional)]
    assert required.status is SubAgentTaskStatus.FAILED
    assert "cannot enforce a sandbox" in (required.error or ""), required.error
    assert infos[0]["sandbox"]["refused"]  # type: ignore[typeddict-item]
    assert optional.status is SubAgentTaskStatus.COMPLETED  # unconfined, and it says so
    assert infos[1]["sandbox"] == {  # type: ignore[typeddict-item]
        "enforced": False,
        "reason": "InProcessRunner runs children as asyncio tasks inside the parent: it cannot "
        "enforce a sandbox; use ProcessRunner (the default)",
    }
    assert (optional.output or "").startswith("read 17"), optional.output


def test_definitions_and_extensions_check_their_sandbox() -> None:
    with pytest.raises(TypeError, match=r"takes a zett_agent\.process\.Sandbox"):
        SubAgentDefinition("x", "d", "p", sandbox={"network": "none"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not combine with a sandbox"):
        SubAgentDefinition("x", "d", "p", limits=ProcessLimits(env={}), sandbox=Sandbox())
    plain = SubAgentDefinition("x", "d", "p", limits=ProcessLimits(cwd="/tmp"))
    with pytest.raises(ValueError, match="do not combine with a sandbox"):
        AsyncSubAgentExtension([plain], sandbox=Sandbox())
    with pytest.raises(TypeError, match="Sandbox"):
        SubAgentExtension([plain], sandbox="none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no such account"):
        SubAgentDefinition("x", "d", "p", sandbox=Sandbox(user="zett-no-such-account"))
    assert SubAgentDefinition("x", "d", "p").sandbox is None


def test_a_refused_job_is_a_whole_job() -> None:
    error = SandboxUnavailable("no", ("runner",))
    job = RefusedJob(error, {"sandbox": {"enforced": False}})

    async def check() -> None:
        assert [e async for e in job.events()] == []
        await job.wait()
        await job.cancel()

    asyncio.run(check())
    assert job.done() and job.exception() is error and job.pid is None
    with pytest.raises(SandboxUnavailable):
        job.result()
    assert job.usage().elapsed == 0.0 and job.info() == {"sandbox": {"enforced": False}}


@needs_sandbox
async def test_an_egress_childs_connections_are_counted_in_its_task_info_and_on_its_span() -> None:
    """Its allowed and denied connections, and the bytes, in ``task_info`` (as the model sees
    it) and on its ``invoke_agent`` span."""
    import http.server
    import threading

    from support.tracing import exported_spans

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    egress = Egress(allow=[f"api.test:{port}"], hosts={"api.test": "127.0.0.1"})
    child = SubAgentDefinition(
        "fetcher",
        "fetches",
        "p",
        model=ToolsThenAnswer(
            "{last}",
            tools=[
                ("fetch", {"url": f"http://api.test:{port}/"}),
                ("fetch", {"url": f"http://other.test:{port}/"}),
            ],
        ),
        tools=[FETCH],
        sandbox=Sandbox(network=egress),
    )
    try:
        with exported_spans() as exporter:
            model = start_and_read("fetcher")
            extension = AsyncSubAgentExtension([child])
            async with extension, parent_answer(model, extension):
                [task] = extension.tasks("parent")
                info = extension.task_info(task)
            spans = exporter.get_finished_spans()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    assert task.output == "refused: 403"
    entry: dict[str, Any] = info["egress"]  # type: ignore[typeddict-item]
    assert (entry["allowed"], entry["denied"]) == (1, 1) and entry["bytes"] > 5, entry
    # the first connection's close may be seen after the second request was decided
    assert sorted((d["host"], d["reason"][:6]) for d in entry["recent"]) == [
        ("api.test", "allowe"),
        ("api.test", "closed"),
        ("other.test", "other."),
    ]
    assert info["sandbox"]["network"] == "egress"  # type: ignore[typeddict-item]
    [agent] = [s for s in spans if s.name == "invoke_agent fetcher"]
    assert agent.attributes["zett_agent.egress.allowed"] == 1
    assert agent.attributes["zett_agent.egress.denied"] == 1
    assert agent.attributes["zett_agent.egress.bytes"] == entry["bytes"]
