"""What the parent keeps of a durable task: its prompt, its tries and their deaths, its journal.

A task of ``AsyncSubAgentExtension(durable=True)`` carries a ``DurableState``
(``SubAgentTask.durable``): what a new child needs to resume it (the prompt, the definition,
the parent's model), how often it resumed and why each try died, the size of its journal and
the number of its next step, and whether it waits for a resume after its host restarted. The
store keeps the part that survives a restart (``TaskStore.durable``, the journal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zett_agent.extensions._tasks._store_schema import MAX_DEATHS

if TYPE_CHECKING:
    from zett_agent._model import Model
    from zett_agent.extensions._definition import SubAgentDefinition
    from zett_agent.runners._child import ChildSpec

__all__ = ["HOST_STOPPED", "DurableState", "check_durable"]

#: a try's death when its host stopped (a restart found the task running)
HOST_STOPPED = "the host stopped while the task ran; it resumed after the restart"


@dataclass(eq=False)
class DurableState:
    """A durable task's own state in the parent.

    Attributes:
        prompt: What the task was asked first.
        definition: The profile its children are built from (``None`` until a restarted
            host found it: then its ``subagent_type`` names it).
        model: The parent's model its children use when the definition has none (``None``
            until a request gives one).
        resumes: Resumes so far: after a death of its child, or a restart of its host.
        crashes: Deaths of its child since its last start or follow-up (``max_resumes``
            bounds them).
        deaths: Each try that died, oldest first: ``{"try": n, "reason": "..."}``.
        steps: Steps its journal holds; ``bytes`` their size; ``next_step`` the next one's
            number.
        waiting: It waits for its session's next request to resume (its host restarted).
    """

    prompt: str
    definition: SubAgentDefinition | None = None
    model: Model | None = None
    resumes: int = 0
    crashes: int = 0
    deaths: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    bytes: int = 0
    next_step: int = 1
    waiting: bool = False

    @property
    def tries(self) -> int:
        """The try that runs now (or ran last): 1, then one more per resume."""
        return self.resumes + 1

    def died(self, reason: str) -> None:
        """Record that the try running now died, and why (the oldest are dropped past a bound)."""
        self.deaths.append({"try": self.tries, "reason": reason[:500]})
        del self.deaths[:-MAX_DEATHS]

    def columns(self) -> dict[str, Any]:
        """What ``TaskStore.update_durable`` writes of it."""
        return {"resumes": self.resumes, "crashes": self.crashes, "deaths": list(self.deaths)}


def check_durable(spec: ChildSpec) -> None:
    """Refuse a durable child whose spec cannot be pickled (each resume ships it anew).

    Raises:
        TypeError: Naming the part that cannot be pickled, and the fix.
    """
    import cloudpickle

    from zett_agent.runners._child import unpicklable_part

    try:
        cloudpickle.dumps(spec)
    except Exception as exc:
        part = unpicklable_part(spec) or f"{type(exc).__name__}: {exc}"
        raise TypeError(
            f"cannot start a durable task of {spec.definition.name!r}: {part}. A durable task's "
            "definition is shipped to a new child at each resume, so it must be picklable or "
            "importable: keep locks, clients and connections out of it (create them in the "
            "child), or define it in an importable module"
        ) from exc
