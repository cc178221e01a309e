"""``create_agent`` and the client: every operation delegates with the client's config."""

from __future__ import annotations

import asyncio
from typing import Any

from support.recorders import Recorder, echo
from zett_agent.agent import Agent, AgentRunConfig, AgentRunContext
from zett_agent.client import AgentClient, create_agent
from zett_agent.events import AgentEvent, InternalMessageEvent, RunCompletedEvent
from zett_agent.extensions import Extension
from zett_agent.messages import AgentMessage, AssistantMessage, UserMessage
from zett_agent.testing import ScriptedModel


class Accepting(Extension):
    def __init__(self) -> None:
        self.configs: list[Any] = []
        self.completed = asyncio.Event()

    def accept(self, config: AgentRunConfig | None, event: Any) -> bool:
        self.configs.append(config)
        return event == "yes"

    async def on_event(self, context: AgentRunContext, event: AgentEvent) -> None:
        if isinstance(event, RunCompletedEvent):
            self.completed.set()


async def test_client_runs_compacts_publishes_and_accepts_in_its_session() -> None:
    log: list[tuple[str, str]] = []
    accepting = Accepting()
    model = ScriptedModel(["first", "woken"])
    config = AgentRunConfig(session_id="client-session")
    async with await create_agent(
        model,
        config=config,
        extensions=[Recorder(log), accepting],
        tools=[echo],
        system_prompt="be brief",
    ) as client:
        assert isinstance(client, AgentClient) and isinstance(client.agent, Agent)
        assert client.config is config
        result = await client.run("hi")
        assert isinstance(result, AssistantMessage) and result.content == "first"
        assert model.requests[0].system_prompt == "be brief"
        assert [t.name for t in model.requests[0].tools] == ["echo"]

        log.clear()
        await client.compact()
        assert [h for h, _ in log] == [
            "Recorder.on_tool",
            "Recorder.on_state",
            "Recorder.on_compact",
        ]

        assert client.accept("yes") == ("Accepting",)
        assert client.accept("no") == ()
        assert accepting.configs == [config, config]

        accepting.completed.clear()
        await client.publish(InternalMessageEvent("client-session", "wake"))
        await accepting.completed.wait()
        assert client.agent.messages("client-session")[-2:] == (
            AgentMessage("wake", source="internal"),
            AssistantMessage("woken"),
        )
    assert client.agent.closed


async def test_client_steer_goes_to_its_session() -> None:
    accepting = Accepting()
    client = await create_agent(
        ScriptedModel(["ok"]), config=AgentRunConfig(session_id="s"), extensions=[accepting]
    )
    assert client.steer("idle steer") is False
    await client.wait_idle()
    assert accepting.completed.is_set()
    await client.close()
    await client.close()
    assert client.agent.messages("s") == (UserMessage("idle steer"), AssistantMessage("ok"))
