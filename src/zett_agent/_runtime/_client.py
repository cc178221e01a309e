"""A small facade over ``Agent`` bound to one ``AgentRunConfig``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zett_agent._events import AgentEvent
from zett_agent._messages import AssistantMessage, UserMessage
from zett_agent._model import Model
from zett_agent._runtime._agent import Agent
from zett_agent._runtime._context import AgentRunConfig
from zett_agent._runtime._extension import Extension
from zett_agent._tools import AgentTool

__all__ = ["AgentClient", "create_agent"]


class AgentClient:
    """An agent plus the config every call uses (its session, limits and metadata).

    An async context manager: leaving it calls ``close()``.
    """

    def __init__(self, agent: Agent, config: AgentRunConfig) -> None:
        self._agent = agent
        self._config = config

    @property
    def agent(self) -> Agent:
        return self._agent

    @property
    def config(self) -> AgentRunConfig:
        return self._config

    async def run(self, input: str | UserMessage) -> AssistantMessage:
        """Run one request; see ``Agent.run`` for errors and cancellation."""
        return await self._agent.run(input, config=self._config)

    async def compact(self) -> None:
        """Compact the session; see ``Agent.compact``."""
        await self._agent.compact(config=self._config)

    def steer(self, message: str | UserMessage) -> bool:
        """Steer the running request, or start one if idle; see ``Agent.steer``."""
        return self._agent.steer(message, config=self._config)

    async def publish(self, event: AgentEvent) -> None:
        """Publish an event to the extensions; see ``Agent.publish``."""
        await self._agent.publish(event, config=self._config)

    def accept(self, event: Any) -> tuple[str, ...]:
        """Broadcast an external event; returns the names of the extensions that accepted."""
        return self._agent.accept(event, config=self._config)

    async def wait_idle(self) -> None:
        """Wait until the agent's background requests finished; see ``Agent.wait_idle``."""
        await self._agent.wait_idle()

    async def close(self) -> None:
        """Close the agent; idempotent.

        See ``Agent.close``: its background requests are cancelled, and its extensions release what
        they keep for the sessions it ran (the background tasks of ``AsyncSubAgentExtension`` in
        those sessions are cancelled and forgotten), so close a client when its sessions are done,
        not per request.
        """
        await self._agent.close()

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AgentClient session={self._config.session_id!r} agent={self._agent!r}>"


async def create_agent(
    model: Model,
    *,
    config: AgentRunConfig | None = None,
    extensions: Iterable[Extension] = (),
    tools: Iterable[AgentTool] = (),
    system_prompt: str | None = None,
) -> AgentClient:
    """Build an ``Agent`` and return a client bound to ``config`` (default ``AgentRunConfig()``).

    Raises:
        ValueError: two extensions share a name.
    """
    agent = Agent(model, extensions=extensions, tools=tools, system_prompt=system_prompt)
    return AgentClient(agent, config or AgentRunConfig())
