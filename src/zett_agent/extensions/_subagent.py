"""The foreground ``SubAgentExtension`` and what both subagent extensions share."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zett_agent.extensions._base import Extension
from zett_agent.extensions._child import ChildSpec
from zett_agent.extensions._definition import SubAgentDefinition, default_subagents
from zett_agent.extensions._runner import ChildRunner, failure_reason, report_content
from zett_agent.tools import AgentTool

if TYPE_CHECKING:
    from zett_agent._model import Model
    from zett_agent.agent import Agent, AgentRunContext
    from zett_agent.process import ProcessLimits, ProcessPool

# Attributes that live only in the parent process; never shipped to a child.
_PARENT_ONLY = ("_runner", "_sessions", "_counter", "_closing")


class ChildAgentExtension(Extension):
    """Shared base: holds the definitions, the process runner, and builds child agents.

    The extension object itself is shipped to each child process (without its parent-only
    state) so that an override of ``_create_child`` runs where the child lives.
    """

    def __init__(
        self,
        subagents: Sequence[SubAgentDefinition] | None = None,
        *,
        pool: ProcessPool | None = None,
        limits: ProcessLimits | None = None,
        kill_grace: float = 0.0,
        max_workers: int | None = None,
    ) -> None:
        super().__init__()
        definitions = tuple(default_subagents() if subagents is None else subagents)
        if not definitions:
            raise ValueError("give at least one SubAgentDefinition (or None for the built-ins)")
        names = [d.name for d in definitions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"subagent names must be unique; repeated: {', '.join(duplicates)}")
        self.subagents: tuple[SubAgentDefinition, ...] = definitions
        self._runner = ChildRunner(
            pool, max_workers=max_workers, limits=limits, kill_grace=kill_grace
        )
        self._counter = 0  # numbers the children this extension started

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _PARENT_ONLY}

    def definition(self, subagent_type: str) -> SubAgentDefinition:
        """Return the profile named ``subagent_type``; ``ValueError`` lists the valid names."""
        for definition in self.subagents:
            if definition.name == subagent_type:
                return definition
        known = ", ".join(repr(d.name) for d in self.subagents)
        raise ValueError(
            f"unknown subagent_type {short_repr(subagent_type)}; choose one of: {known}"
        )

    def _create_child(
        self, definition: SubAgentDefinition, *, model: Model, session_id: str
    ) -> Agent:
        """Build one child agent. Runs in the child's own process.

        Override to change how children are built (extra tools, extensions, prompts). Use the
        ``model`` given (it is the definition's model, or the parent's, wrapped to report
        progress), and return an ordinary ``Agent``.
        """
        from zett_agent.agent import Agent

        return Agent(
            model,
            extensions=definition.extensions,
            tools=definition.tools,
            system_prompt=definition.system_prompt,
        )

    def _child_spec(
        self,
        context: AgentRunContext,
        definition: SubAgentDefinition,
        *,
        session_id: str,
        prompt: str,
    ) -> ChildSpec:
        model = definition.model if definition.model is not None else context.model
        return ChildSpec(self, definition, model, session_id, prompt)

    def _profiles_text(self) -> str:
        return "; ".join(f"{d.name}: {d.description}" for d in self.subagents)


class SubAgentExtension(ChildAgentExtension):
    """Run one child agent in its own process and block the calling tool until it reports.

    Registers the tool ``subagent`` (``subagent_type``, ``description``, ``prompt``). The child
    is an ordinary agent with its own session, built from a ``SubAgentDefinition``; its report is
    the tool's result. A failed child gives a failed tool result with a one-line reason.

    Cancellation: cancelling the parent's request kills the child's whole process tree and
    waits until it is gone before the cancellation propagates.
    """

    tool_name = "subagent"

    async def on_tool(self, context: AgentRunContext) -> None:
        self._runner.warm_up()
        context.register_tool(self.build_tool(context))

    def build_tool(self, context: AgentRunContext) -> AgentTool:
        """Return the blocking ``subagent`` tool for one request."""

        async def subagent(subagent_type: str, description: str, prompt: str) -> str:
            return await self.run_child(context, subagent_type, description, prompt)

        return AgentTool(
            name=self.tool_name,
            description=(
                "Run a subagent in its own process and wait for its report. Profiles: "
                + self._profiles_text()
            ),
            parameters=_START_SCHEMA,
            handler=subagent,
            guidelines=(
                "Use `subagent` for a self-contained piece of work whose report you need before "
                "going on; it blocks until the child finishes. Give it a complete prompt: the "
                "child does not see this conversation."
            ),
        )

    async def run_child(
        self, context: AgentRunContext, subagent_type: str, description: str, prompt: str
    ) -> str:
        """Run one child to completion and return its report.

        Raises ``ValueError`` for an unknown profile or empty prompt and ``RuntimeError`` with a
        one-line reason when the child fails.
        """
        definition = self.definition(subagent_type)
        if not prompt.strip():
            raise ValueError("prompt is empty; give the subagent the full task to work on")
        self._counter += 1
        session_id = f"{context.session_id}/subagent-{self._counter}"
        job = await self._runner.submit(
            self._child_spec(context, definition, session_id=session_id, prompt=prompt)
        )
        try:
            await job.wait()
        except asyncio.CancelledError:
            await asyncio.shield(job.cancel(grace=self._runner.kill_grace))
            raise
        error = job.exception()
        if error is not None:
            raise RuntimeError(f"subagent {description!r} failed: {failure_reason(error)}")
        return report_content(job.result())

    async def close(self) -> None:
        """Close the process pool this extension created (a shared pool is left open)."""
        await self._runner.close()

    async def __aenter__(self) -> SubAgentExtension:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


_START_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "subagent_type": {
            "type": "string",
            "description": "which configured subagent profile to run",
        },
        "description": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "a short label for the task (3-8 words)",
        },
        "prompt": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100_000,
            "description": "the complete task for the child; it does not see this conversation",
        },
    },
    "required": ["subagent_type", "description", "prompt"],
    "additionalProperties": False,
}


def short_repr(value: object, limit: int = 100) -> str:
    """``repr(value)`` cut to about ``limit`` characters.

    Errors echo what the model sent so it can fix the call; an echo of a megabyte argument
    would flood the model's context with its own mistake.
    """
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def start_schema() -> dict[str, Any]:
    """A copy of the JSON schema shared by ``subagent`` and ``task_start``."""
    import copy

    return copy.deepcopy(_START_SCHEMA)
