"""The child side of ``bench_brokered``'s streaming measurement, kept light to import.

Every child unpickles ``Counting`` by reference, so it imports this module: it imports only what
a brokered child holds anyway (the agent, the definition, the model types). Defined in
``bench_brokered`` itself, every child imported the benchmark with its helpers and their imports
(about 0.25 s of CPU each, and ``ssl``): 1,000 children spent some 250 s of CPU on it, the
benchmark measuring its own imports rather than the parent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from zett_agent.agent import Agent
from zett_agent.extensions._definition import SubAgentDefinition
from zett_agent.model import Model, ModelEvent, ModelEventKind, ModelRequest, RetryOptions


class CountingModel:
    """Wraps the child's model; reports the text deltas it received (in the child)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.retry: RetryOptions = inner.retry

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        from zett_agent.process import emit

        pieces: list[str] = []
        async for event in self.inner.stream(request):
            if event.kind is ModelEventKind.TEXT_DELTA:
                pieces.append(event.text)
            elif event.kind is ModelEventKind.COMPLETED:
                emit({"kind": "deltas", "count": len(pieces), "text": "".join(pieces)})
            yield event


class Counting:
    """Builds the child around a ``CountingModel`` (``_create_child`` runs in the child).

    A spec's ``factory`` needs only ``_create_child``; not a ``ChildAgentExtension`` subclass,
    whose module imports the parent's side of the engine (about 0.1 s of CPU in each child).
    """

    def _create_child(
        self, definition: SubAgentDefinition, *, model: Model, session_id: str
    ) -> Agent:
        return Agent(CountingModel(model), system_prompt=definition.system_prompt)
