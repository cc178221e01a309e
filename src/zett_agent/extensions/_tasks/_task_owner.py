"""What the parts of the background tasks need of the extension they serve: ``TaskOwner``.

The registry, the guard, the watch, the notices, the mail and the tools read the owner's
options and call its hooks and public methods as they are now (a subclass may override any);
they never reach into its internals. ``AsyncSubAgentExtension`` satisfies this protocol as it
is; nothing here imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from zett_agent._runtime._context import AgentRunContext
    from zett_agent.extensions._definition import SubAgentDefinition
    from zett_agent.extensions._tasks._task import SubAgentTask, SubAgentTaskInfo
    from zett_agent.runners._base import ChildRunner

__all__ = ["TaskOwner"]


class TaskOwner(Protocol):
    """The extension the task parts serve: its options, hooks and public methods."""

    @property
    def name(self) -> str:
        """Its registration name (a notice's author)."""
        ...

    @property
    def runner(self) -> ChildRunner:
        """Where its children run."""
        ...

    @property
    def max_concurrent(self) -> int:
        """Running tasks allowed per session."""
        ...

    @property
    def max_retained(self) -> int:
        """Finished tasks kept per session."""
        ...

    @property
    def max_sessions(self) -> int:
        """Idle sessions kept."""
        ...

    @property
    def notify_parent(self) -> bool:
        """Whether finished tasks are announced."""
        ...

    @property
    def stall_seconds(self) -> float | None:
        """Seconds without a sign of work after which a task stalled (None: never)."""
        ...

    @property
    def session_token_budget(self) -> int | None:
        """Tokens all the tasks of a session may use (None: no limit)."""
        ...

    @property
    def extra_tools(self) -> tuple[str, ...]:
        """The opt-in tools, by name."""
        ...

    @property
    def durable(self) -> bool:
        """Whether its tasks are durable (journaled, resumed)."""
        ...

    @property
    def max_resumes(self) -> int:
        """How often a durable task resumes after its child died."""
        ...

    def definition(self, subagent_type: str) -> SubAgentDefinition:
        """The profile of that name (``ValueError`` naming the valid ones)."""
        ...

    def completion_notice(self, task: SubAgentTask) -> str | None:
        """The message that tells the parent a task finished (None: silent)."""
        ...

    def stall_notice(self, task: SubAgentTask) -> str | None:
        """The message that tells the parent a task stalled (None: silent)."""
        ...

    async def task_finished(self, task: SubAgentTask) -> None:
        """A task reached a terminal status."""
        ...

    async def task_stalled(self, task: SubAgentTask) -> None:
        """A running task stalled."""
        ...

    def task_info(self, task: SubAgentTask, *, include_output: bool = False) -> SubAgentTaskInfo:
        """One task described for the model."""
        ...

    def get_task(self, session_id: str, task_id: str) -> SubAgentTask:
        """One task of a session (``ValueError`` naming the known ids)."""
        ...

    def tasks(self, session_id: str) -> tuple[SubAgentTask, ...]:
        """The tasks of a session, oldest first."""
        ...

    async def start(
        self,
        context: AgentRunContext,
        definition: SubAgentDefinition,
        *,
        description: str,
        prompt: str,
    ) -> SubAgentTask:
        """Start one background task."""
        ...

    async def resume(
        self, context: AgentRunContext, task: SubAgentTask, prompt: str
    ) -> SubAgentTask:
        """Continue a finished durable task with a follow-up prompt."""
        ...

    async def wait(self, task: SubAgentTask, timeout: float | None = None) -> SubAgentTask:  # noqa: ASYNC109 (the seed's signature)
        """Wait until a task finishes or ``timeout`` passes."""
        ...

    async def cancel(self, task: SubAgentTask) -> SubAgentTask:
        """Cancel a running task and wait for it to settle."""
        ...
