"""How a child's agent is built and run where the child runs: the build every spec carries.

``build_child`` is the ``ChildBuild`` a subagent extension names in each ``ChildSpec`` it makes
(and the default of a spec made by hand). ``run_child`` (``zett_agent.runners._child``) calls
it in the child: it builds the agent with the extension class's ``_create_child`` (the spec's
``factory``, or ``ChildAgentExtension``), registers the ``ChildInbox`` last, and returns a
``ChildRun`` that runs the prompt, takes the parent's messages and closes what the child holds.
The runner knows only that protocol; what an agent is stays here.

Imported by every child (the module of every definition imports it): light.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

from zett_agent._messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent._model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent._tools import AgentTool
from zett_agent.extensions._child_inbox import ChildInbox, attach
from zett_agent.extensions._definition import StartsChildren, SubAgentDefinition
from zett_agent.runners._child import ChildSpec, set_default_build

if TYPE_CHECKING:
    from zett_agent._model import Model
    from zett_agent._runtime._agent import Agent

__all__ = ["AgentChildRun", "build_child", "create_child", "default_agent", "rehearsal_spec"]


class AgentChildRun:
    """The ``ChildRun`` of an agent: its prompt, its run config and its inbox."""

    def __init__(self, agent: Agent, spec: ChildSpec, emit: Callable[[Any], None]) -> None:
        from zett_agent.agent import AgentRunConfig

        config = AgentRunConfig(session_id=spec.session_id)
        max_turns = getattr(spec.definition, "max_turns", None)
        if max_turns is not None:
            config = AgentRunConfig(session_id=spec.session_id, max_turns=max_turns)
        self._agent = agent
        self._config = config
        self._prompt = spec.prompt
        inbox = ChildInbox(agent, config, emit)
        attach(agent, inbox)
        self.take = inbox.take

    async def run(self) -> str:
        """Run the prompt; the report's text. Raises what the agent raises."""
        result = await self._agent.run(self._prompt, config=self._config)
        return result.content

    async def close(self) -> None:
        """Close the agent, then the subagent extensions of a child that started children."""
        await self._agent.close()
        for extension in self._agent.extensions:
            if isinstance(extension, StartsChildren):
                await extension.close()


def build_child(spec: ChildSpec, model: Model, emit: Callable[[Any], None]) -> AgentChildRun:
    """Build the child's agent with ``_create_child``, as the spec says (runs in the child).

    Raises what ``_create_child`` raises.
    """
    return AgentChildRun(create_child(spec, model), spec, emit)


def create_child(spec: ChildSpec, model: Model) -> Agent:
    """Build the agent of ``spec`` (in the child).

    With the extension class's ``_create_child`` when the spec names one (``factory``): ``self``
    there is a fresh instance of the class made without ``__init__``, holding only the spec's
    ``state`` (what ``child_state()`` returned in the parent). Else ``default_agent``, which is
    what ``_create_child`` does unless overridden.
    """
    definition = cast("SubAgentDefinition", spec.definition)
    factory = spec.factory
    if factory is None:
        return default_agent(definition, model)
    instance: Any = cast(Any, factory).__new__(factory)
    instance.__dict__.update(spec.state)
    agent: Agent = instance._create_child(definition, model=model, session_id=spec.session_id)
    return agent


def default_agent(definition: SubAgentDefinition, model: Model) -> Agent:
    """The agent a definition describes: its tools, extensions and system prompt on ``model``."""
    from zett_agent.agent import Agent

    return Agent(
        model,
        extensions=definition.extensions,
        tools=definition.tools,
        system_prompt=definition.system_prompt,
    )


class _RehearsalModel:
    """The rehearsal's model: one tool call, then the answer (see ``rehearsal_spec``)."""

    retry: RetryOptions = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if any(isinstance(message, ToolMessage) for message in request.messages):
            reply = AssistantMessage(content="rehearsed")
        else:
            reply = AssistantMessage(tool_calls=(ToolCall("rehearsal", "rehearse", {}),))
        yield ModelEvent.completed(ModelResponse(reply, Usage(1, 1)))


def _rehearse() -> str:
    return "ok"


def rehearsal_spec() -> ChildSpec:
    """What a spare worker rehearses (``zett_agent.runners._child.rehearse``).

    A child whose stand-in model calls one tool and answers, built and run by this module's
    build.
    """
    model = _RehearsalModel()
    tool = AgentTool("rehearse", "Rehearse.", {"type": "object", "properties": {}}, _rehearse)
    definition = SubAgentDefinition("rehearsal", "A spare's rehearsal.", "", model, [tool])
    return ChildSpec(definition, model, "rehearsal/rehearsal", "rehearse", build=build_child)


set_default_build(build_child, rehearsal_spec)
