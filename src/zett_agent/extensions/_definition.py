"""What a child agent is made of: ``SubAgentDefinition`` and the built-in profiles."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zett_agent._model import Model

if TYPE_CHECKING:
    from zett_agent.extensions._base import Extension
    from zett_agent.process import ProcessLimits
    from zett_agent.tools import AgentTool


@dataclass(frozen=True)
class SubAgentDefinition:
    """A profile the parent may start children from.

    Everything in a definition is shipped to the child process with cloudpickle, so models,
    tools and extensions defined in a script's ``__main__``, a notebook or a REPL work. They must
    hold no live resources (open sockets, locks, event loops) in their pickled state.

    Args:
        name: The ``subagent_type`` the model passes to ``task_start``; unique per extension.
        description: One line telling the model when to pick this profile.
        system_prompt: The child's system prompt.
        model: The child's model; ``None`` means the parent's model.
        tools: Tools the child may call. Tool restrictions are not an OS sandbox.
        extensions: Extensions of the child agent (built in the child process).
        limits: Wall time, memory, CPU time, open files, environment and working directory of
            the child's process (``zett_agent.process.ProcessLimits``); ``None`` means the
            extension's default limits.
        max_turns: Turn budget of the child's request; ``None`` means the runtime default.
    """

    name: str
    description: str
    system_prompt: str
    model: Model | None = None
    tools: Sequence[AgentTool] = field(default=())
    extensions: Sequence[Extension] = field(default=())
    limits: ProcessLimits | None = None
    max_turns: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "_").isidentifier():
            raise ValueError(
                f"SubAgentDefinition.name must be a short identifier like 'explore', "
                f"got {self.name!r}"
            )
        if not self.description.strip():
            raise ValueError(f"SubAgentDefinition {self.name!r} needs a description")
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "extensions", tuple(self.extensions))
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")


REASONING_PROMPT = (
    "You are a careful reasoning assistant working on one delegated problem. Think it through "
    "and answer with a concise, self-contained report; you have no tools."
)

EXPLORE_PROMPT = (
    "You explore a code base to answer one question. Use the read-only file tools "
    "(list_files, grep, read_file) to find the relevant places, then answer with a concise "
    "report that names files and line numbers. You cannot change any file."
)


def reasoning_profile(model: Model | None = None) -> SubAgentDefinition:
    """The built-in ``reasoning`` profile: no tools, the parent's model unless given."""
    return SubAgentDefinition(
        name="reasoning",
        description="think through a self-contained problem and report a conclusion (no tools).",
        system_prompt=REASONING_PROMPT,
        model=model,
    )


def explore_profile(root: str | None = None, model: Model | None = None) -> SubAgentDefinition:
    """The built-in ``explore`` profile: read-only file tools that stay inside ``root``.

    ``root`` defaults to the child's working directory (the parent's, unless limits set ``cwd``).
    """
    from zett_agent.extensions._file_tools import read_only_file_tools

    return SubAgentDefinition(
        name="explore",
        description="search and read files (read-only) to answer a question about a code base.",
        system_prompt=EXPLORE_PROMPT,
        model=model,
        tools=read_only_file_tools(root),
    )


def default_subagents() -> tuple[SubAgentDefinition, ...]:
    """The profiles used when an extension is given none: ``reasoning`` and ``explore``."""
    return (reasoning_profile(), explore_profile())
