"""The child side of a subagent: runs inside its own worker process of the process engine.

The parent ships a ``ChildSpec`` (cloudpickle); the child builds its agent through the
extension's ``_create_child`` (so an override takes effect here), runs the prompt, streams
progress with ``zett_agent.process.emit`` and returns a JSON-compatible report.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from zett_agent._model import Model, ModelEvent, ModelEventKind, ModelRequest, RetryOptions

if TYPE_CHECKING:
    from zett_agent.agent import Agent
    from zett_agent.extensions._definition import SubAgentDefinition


class ChildFactory(Protocol):
    def _create_child(
        self, definition: SubAgentDefinition, *, model: Model, session_id: str
    ) -> Agent: ...


@dataclass(frozen=True)
class ChildSpec:
    """Everything a child process needs; shipped with cloudpickle."""

    factory: ChildFactory
    definition: SubAgentDefinition
    model: Model
    session_id: str
    prompt: str


class ProgressModel:
    """Wraps the child's model and reports each call to the parent as a progress event.

    Progress rides on the model rather than on an extension so that it works whatever agent
    ``_create_child`` builds, as long as it uses the model it was given.
    """

    def __init__(self, inner: Model, emit: Callable[[Any], None]) -> None:
        self.inner = inner
        self.retry: RetryOptions = inner.retry
        self._emit = emit
        self._turn = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self._turn += 1
        self._emit({"kind": "turn_started", "turn": self._turn})
        async for event in self.inner.stream(request):
            if event.kind is ModelEventKind.COMPLETED and event.response is not None:
                usage = event.response.usage
                self._emit(
                    {
                        "kind": "turn_finished",
                        "turn": self._turn,
                        "tool_calls": [call.name for call in event.response.message.tool_calls],
                        "input_tokens": usage.input_tokens if usage else 0,
                        "output_tokens": usage.output_tokens if usage else 0,
                    }
                )
            yield event


async def run_child(spec: ChildSpec, emit: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Build the child agent, run its prompt, return ``{"content": ..., ...}``.

    Progress goes to ``emit`` (default: ``zett_agent.process.emit``, to the parent's pipe).
    Raises whatever the child agent raises; the engine reports it to the parent as ``JobFailed``.
    """
    from zett_agent.agent import AgentRunConfig

    if emit is None:
        from zett_agent.process import emit as to_parent

        emit = to_parent

    started = time.monotonic()
    model = ProgressModel(spec.model, emit)
    agent = spec.factory._create_child(spec.definition, model=model, session_id=spec.session_id)
    config = AgentRunConfig(session_id=spec.session_id)
    if spec.definition.max_turns is not None:
        config = AgentRunConfig(session_id=spec.session_id, max_turns=spec.definition.max_turns)
    emit({"kind": "started"})
    try:
        result = await agent.run(spec.prompt, config=config)
    finally:
        await agent.close()
    return {"content": result.content, "seconds": time.monotonic() - started}
