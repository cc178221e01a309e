"""The foreground SubAgentExtension, the built-in profiles and their read-only file tools."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from support.calls import call
from support.children import SEGFAULT, WHOAMI
from support.liveness import alive
from support.scripted_models import StepModel, tool_results
from support.scripted_models import ToolsThenAnswer as ChildModel
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.subagent import (
    SubAgentDefinition,
    SubAgentExtension,
    default_subagents,
    explore_profile,
)
from zett_agent.messages import AssistantMessage

HANG_GUARD = 60


async def run(extension: SubAgentExtension, steps: list[object]) -> tuple[str, StepModel]:
    model = StepModel(steps)
    client = await create_agent(
        model, config=AgentRunConfig(session_id="p"), extensions=[extension]
    )
    async with asyncio.timeout(HANG_GUARD):
        result = await client.run("go")
    await client.close()
    return result.content, model


def definition(
    model: object, name: str = "w", tools: tuple[object, ...] = ()
) -> SubAgentDefinition:
    return SubAgentDefinition(name, "test profile", "child", model=model, tools=tools)  # type: ignore[arg-type]


async def test_foreground_subagent_blocks_and_returns_the_report_from_another_process() -> None:
    async with SubAgentExtension(
        [definition(ChildModel("pid {last}", tools=[("whoami", {})]), tools=(WHOAMI,))]
    ) as ext:
        _, model = await run(
            ext,
            [
                call("subagent", subagent_type="w", description="d", prompt="p"),
                AssistantMessage("ok"),
            ],
        )
    [result] = tool_results(model.requests[-1])
    assert result.ok
    assert int(result.text.split()[-1]) != os.getpid()


async def test_foreground_subagent_failure_is_a_failed_tool_result_with_a_reason() -> None:
    async with SubAgentExtension(
        [definition(ChildModel(tools=[("segfault", {})]), tools=(SEGFAULT,))]
    ) as ext:
        content, model = await run(
            ext,
            [
                call("subagent", subagent_type="w", description="crash", prompt="p"),
                AssistantMessage("went on"),
            ],
        )
    [result] = tool_results(model.requests[-1])
    assert content == "went on"
    assert result.failed and "SIGSEGV" in result.text


async def test_builtin_profiles_use_the_parents_model() -> None:
    profiles = {d.name: d for d in default_subagents()}
    assert set(profiles) == {"reasoning", "explore"}
    assert profiles["reasoning"].tools == () and profiles["reasoning"].model is None
    assert {t.name for t in profiles["explore"].tools} == {"read_file", "list_files", "grep"}

    parent_then_child = StepModel(
        [
            call("subagent", subagent_type="reasoning", description="d", prompt="2+2?"),
            AssistantMessage("4"),
        ]
    )
    async with SubAgentExtension() as ext:
        client = await create_agent(
            parent_then_child, config=AgentRunConfig(session_id="p"), extensions=[ext]
        )
        async with asyncio.timeout(HANG_GUARD):
            await client.run("go")
        await client.close()
    # The child ran on a pickled copy of the parent's model: its answer came from the same script.
    [result] = tool_results(parent_then_child.requests[-1])
    assert result.ok and result.text == "4"


def test_definition_validation() -> None:
    with pytest.raises(ValueError, match="identifier"):
        SubAgentDefinition("has spaces", "d", "p")
    with pytest.raises(ValueError, match="unique"):
        SubAgentExtension([definition(None), definition(None)])


async def test_explore_tools_read_list_and_grep_inside_the_root_only(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        "def login():\n    return 1\n\ndef logout():\n    pass\n"
    )
    (tmp_path / "secret.txt").write_text("outside")
    root = tmp_path / "pkg"
    tools = {t.name: t for t in explore_profile(str(root)).tools}

    read = await tools["read_file"].invoke({"path": "a.py", "start_line": 4, "end_line": 5})
    assert "4  def logout():" in read.text and "login" not in read.text
    listing = await tools["list_files"].invoke({"pattern": "*.py"})
    assert listing.text == "a.py"
    hits = await tools["grep"].invoke({"pattern": r"def log(in|out)"})
    assert hits.text.splitlines() == ["a.py:1: def login():", "a.py:4: def logout():"]
    with pytest.raises(PermissionError, match="outside the root"):
        await tools["read_file"].invoke({"path": "../secret.txt"})
    (root / "link").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(PermissionError, match="outside the root"):
        await tools["read_file"].invoke({"path": "link"})
    bad = await tools["read_file"].invoke({"path": "a.py", "start_line": 9})
    assert bad.is_error and "invalid" in bad.text


async def test_cancelling_the_parent_request_kills_the_foreground_child(tmp_path: Path) -> None:
    from support.children import SPIN
    from zett_agent.process import ProcessPool

    ready = tmp_path / "spinning"
    os.mkfifo(ready)
    spinner = definition(ChildModel(tools=[("spin", {"ready_fifo": str(ready)})]), tools=(SPIN,))
    model = StepModel([call("subagent", subagent_type="w", description="spin", prompt="p")])
    async with ProcessPool(max_workers=2) as pool, SubAgentExtension([spinner], pool=pool) as ext:
        client = await create_agent(model, config=AgentRunConfig(session_id="p"), extensions=[ext])
        async with client:
            run = asyncio.ensure_future(client.run("go"))
            pid = int(await asyncio.wait_for(asyncio.to_thread(ready.read_bytes), HANG_GUARD))
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            # The cancellation propagated only after the child's process was gone.
            assert not alive(pid)
