"""How a child's agent is built and run where the child runs: the build every spec carries.

``build_child`` is the ``ChildBuild`` a subagent extension names in each ``ChildSpec`` it makes
(and the default of a spec made by hand). ``run_child`` (``zett_agent.runners._child``) calls
it in the child: it builds the agent with the extension class's ``_create_child`` (the spec's
``factory``, or ``ChildAgentExtension``), registers the ``ChildInbox`` last, and returns a
``ChildRun`` that runs the prompt, takes the parent's messages and closes what the child holds.
The runner knows only that protocol; what an agent is stays here.

A durable child (a spec with a ``journal``) also runs the ``ChildJournal`` (``_child_journal``),
last; one that resumes starts from the conversation its journal rebuilds: it returns the
report the journal already holds, or goes on from where the conversation stopped
(``continue_request``), or, for a follow-up (``task_resume``), runs the follow-up prompt after
it.

Imported by every child (the module of every definition imports it): light.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

from zett_agent._messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    UserMessage,
    skip_unanswered_calls,
)
from zett_agent._model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent._tools import AgentTool
from zett_agent.extensions._child_inbox import ChildInbox, attach
from zett_agent.extensions._definition import StartsChildren, SubAgentDefinition
from zett_agent.runners._child import ChildSpec, ProgressModel, set_default_build

if TYPE_CHECKING:
    from zett_agent._model import Model
    from zett_agent._runtime._agent import Agent

__all__ = [
    "ENDED_SKIP_TEXT",
    "AgentChildRun",
    "build_child",
    "create_child",
    "default_agent",
    "rehearsal_spec",
]

#: what a follow-up (``task_resume``) answers for the calls its task ended without
ENDED_SKIP_TEXT = "skipped: the task ended before this call finished"


class AgentChildRun:
    """The ``ChildRun`` of an agent: its prompt, its run config, its inbox (and its journal)."""

    def __init__(
        self, agent: Agent, spec: ChildSpec, emit: Callable[[Any], None], model: Any = None
    ) -> None:
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
        self._inbox = inbox
        self._journal = None
        self._resume: _Resume | None = None
        if spec.journal is not None:
            self._resume = _Resume(spec, agent)
            if isinstance(model, ProgressModel):  # its turns count on from the journal's
                model.turn = self._resume.turns
            from zett_agent.extensions._child_journal import ChildJournal

            self._journal = ChildJournal(
                self._resume.messages,
                spec.session_id,
                emit,
                next_step=self._resume.next_step,
                batch_step=self._resume.batch_step,
            )
            attach(agent, self._journal)

    def take(self, message: Any) -> None:
        """One message from the parent: the journal's acknowledgement, or one for the inbox."""
        journal = self._journal
        if journal is not None and type(message) is dict and "journal_ack" in message:
            journal.acked(message["journal_ack"])
            return
        self._inbox.take(message)

    async def run(self) -> str:
        """Run the prompt (or resume); the report's text. Raises what the agent raises."""
        resume = self._resume
        if resume is None or resume.fresh:
            result = await self._agent.run(self._prompt, config=self._config)
        elif resume.follow_up is not None:
            resume.answer_ended_calls()
            result = await self._agent.run(resume.follow_up, config=self._config)
        elif resume.report is not None:
            return resume.report  # it had answered; its host or process died before it told
        else:
            from zett_agent._runtime._agent import continue_request

            result = await continue_request(self._agent, self._config, turns_done=resume.turns)
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
    return AgentChildRun(create_child(spec, model), spec, emit, model)


class _Resume:
    """Where a durable child starts: its journal's conversation, restored into its session.

    ``spec.journal`` is ``{"steps": [[step, text], ...], "next": n, "follow_up": str | None}``
    (the parent's committed steps, oldest first, as it stored them). The parent checked each
    step when it stored it; they are checked again here, as any store read is.
    """

    def __init__(self, spec: ChildSpec, agent: Agent) -> None:
        from zett_agent.extensions._journal_entries import history, read_entry

        journal = spec.journal
        assert journal is not None
        steps = [(int(step), read_entry(text)) for step, text in journal["steps"]]
        self.next_step: int = int(journal["next"])
        self.follow_up: str | None = journal.get("follow_up")
        self.fresh = not steps and self.follow_up is None
        conversation = history(entry for _, entry in steps)
        messages: list[Message] = conversation.messages
        if not steps and self.follow_up is not None:
            messages = [UserMessage(spec.prompt)]  # nothing journaled: what it was asked
        self.turns = conversation.turns
        #: the child session's own list, now holding the conversation
        self.messages = agent.session_store.load(spec.session_id).messages
        self.messages[:] = messages
        last = next((m for m in reversed(messages) if isinstance(m, AssistantMessage)), None)
        #: the report the journal already holds (the last message answers without calls)
        self.report = (
            last.content
            if last is not None and messages[-1] is last and not (last.tool_calls)
            else None
        )
        #: the step of the last response, whose calls may still be waiting to run
        self.batch_step: int | None = None
        for step, entry in reversed(steps):
            if any(isinstance(m, AssistantMessage) for m in entry.messages):
                self.batch_step = step
                break

    def answer_ended_calls(self) -> None:
        """Answer, as skipped, the calls the task ended without (before a follow-up)."""
        skip_unanswered_calls(self.messages, ENDED_SKIP_TEXT)


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
    """What the process runner's launcher rehearses (``zett_agent.runners._child.rehearse``).

    A child whose stand-in model calls one tool and answers, built and run by this module's
    build.
    """
    model = _RehearsalModel()
    tool = AgentTool("rehearse", "Rehearse.", {"type": "object", "properties": {}}, _rehearse)
    definition = SubAgentDefinition("rehearsal", "The launcher's rehearsal.", "", model, [tool])
    return ChildSpec(definition, model, "rehearsal/rehearsal", "rehearse", build=build_child)


set_default_build(build_child, rehearsal_spec)
