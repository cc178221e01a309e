"""What a child agent is made of: ``SubAgentDefinition`` and the built-in profiles."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from zett_agent._checks import check_int, described, repeated_names
from zett_agent._model import Model
from zett_agent._runtime._extension import Extension
from zett_agent._tools import AgentTool, tool
from zett_agent.process import ProcessLimits, Sandbox
from zett_agent.process._sandbox._options import check_sandbox


@runtime_checkable
class StartsChildren(Protocol):
    """An extension that starts child agents of its own (a subagent extension is one).

    What a child's build and the preload scan need of it: its definitions (what its children
    import), and ``close()`` (what a child that started children closes as it ends).
    """

    subagents: Sequence[SubAgentDefinition]

    async def close(self) -> None:
        """Close what it started."""
        ...


@dataclass(frozen=True, init=False)
class SubAgentDefinition:
    """A profile the parent may start children from.

    Everything in a definition is shipped to the child process with cloudpickle, so models,
    tools and extensions defined in a script's ``__main__``, a notebook or a REPL work. They must
    hold no live resources (open sockets, locks, event loops) in their pickled state.

    Every field is checked here, at construction, so a mistake fails at the line that made it
    rather than later inside a child: a wrong type raises ``TypeError`` naming the field and the
    fix, a bad value ``ValueError``.

    Args:
        name: The ``subagent_type`` the model passes to ``task_start``; unique per extension.
        description: One line telling the model when to pick this profile.
        system_prompt: The child's system prompt.
        model: The child's model; ``None`` means the parent's model (a copy of it: see the
            README's offline setup for what a copy of an offline model replays).
        tools: Tools the child may call: ``AgentTool`` objects, or plain functions, which are
            wrapped with ``zett_agent.tools.tool`` (type hints and a docstring required). Tool
            restrictions are not an OS sandbox.
        extensions: Extensions of the child agent (``Extension`` instances; they run in the
            child process). An ``AsyncSubAgentExtension`` here lets the child start children
            of its own, each in its own process inside the child's process tree.
        limits: Wall time, memory, CPU time, open files, environment and working directory of
            the child's process (``zett_agent.process.ProcessLimits``); ``None`` means the
            extension's default limits.
        max_turns: Turn budget of the child's request; ``None`` means the runtime default.
        sandbox: A ``zett_agent.process.Sandbox`` around the child's whole process, its model
            loop and tools included: the files it may read and write, the network, the
            environment, the account. ``None`` means the extension's default sandbox (none,
            unless the extension sets one). The runner enforces it before any of the child's
            code runs; the task info's ``sandbox`` entry says what was enforced.
        token_budget: Input plus output tokens the child may use, as its model reports them
            (for a child whose calls the parent brokers, as the parent counts them: reported
            usage, else an estimate, its own children's calls included); ``None`` means no
            limit. When a response takes it past the budget (or, brokered, before a call that
            would), the child's whole tree is killed and the task fails with ``token budget
            exceeded (used U of N tokens)`` (the foreground ``subagent`` tool fails the same
            way).

    Raises:
        TypeError: a field has the wrong type (for example ``limits={"timeout": 1}``).
        ValueError: a field has a bad value (a name that is not an identifier, an empty
            description, two tools with one name, ``max_turns < 1``, a sandbox with
            ``ProcessLimits.env`` or ``cwd``, ``Sandbox(user=...)`` this host cannot give,
            a ``token_budget`` below 1).
    """

    name: str
    description: str
    system_prompt: str
    model: Model | None
    tools: tuple[AgentTool, ...]
    extensions: tuple[Extension, ...]
    limits: ProcessLimits | None
    max_turns: int | None
    sandbox: Sandbox | None
    token_budget: int | None

    def __init__(
        self,
        name: str,
        description: str,
        system_prompt: str,
        model: Model | None = None,
        tools: Iterable[AgentTool | Callable[..., Any]] = (),
        extensions: Iterable[Extension] = (),
        limits: ProcessLimits | None = None,
        max_turns: int | None = None,
        sandbox: Sandbox | None = None,
        token_budget: int | None = None,
    ) -> None:
        for field_name, value in (
            ("name", name),
            ("description", description),
            ("system_prompt", system_prompt),
        ):
            if not isinstance(value, str):
                raise TypeError(
                    f"SubAgentDefinition({field_name}=...) must be a str, got {described(value)}"
                )
        if not name or not name.replace("-", "_").isidentifier():
            raise ValueError(
                f"SubAgentDefinition(name=...) must be a short identifier like 'explore', got "
                f"{name!r:.60}"
            )
        where = f"SubAgentDefinition {name!r}"

        def argument(field_name: str) -> str:
            return f"SubAgentDefinition({name!r}, {field_name}=...)"

        if not description.strip():
            raise ValueError(
                f"{where} needs a description: one line telling the model when to use it"
            )
        if model is not None and not callable(getattr(model, "stream", None)):
            raise TypeError(
                f"{argument('model')} must be a Model (an object with an async stream(request) "
                "method, such as OpenAIChatModel('gpt-4o-mini') or "
                "zett_agent.testing.ScriptedModel) or None for the parent's model, got "
                f"{described(model)}"
            )
        if limits is not None and not isinstance(limits, ProcessLimits):
            raise TypeError(
                f"{argument('limits')} must be a zett_agent.process.ProcessLimits or None, got "
                f"{described(limits)}; write limits=ProcessLimits(timeout=..., memory_bytes=...)"
            )
        if max_turns is not None:
            check_int(argument("max_turns"), max_turns, 1)
        if token_budget is not None:
            check_int(argument("token_budget"), token_budget, 1)
        sandbox = check_sandbox(sandbox, argument("sandbox"))
        check_combination(limits, sandbox, where)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "system_prompt", system_prompt)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "tools", _tools(name, tools))
        object.__setattr__(self, "extensions", _extensions(name, extensions))
        object.__setattr__(self, "limits", limits)
        object.__setattr__(self, "max_turns", max_turns)
        object.__setattr__(self, "sandbox", sandbox)
        object.__setattr__(self, "token_budget", token_budget)


def check_combination(limits: ProcessLimits | None, sandbox: Sandbox | None, where: str) -> None:
    """``ValueError`` for limits that replace what a sandbox decides (environment, cwd)."""
    if sandbox is not None and limits is not None and (limits.env is not None or limits.cwd):
        raise ValueError(
            f"{where}: ProcessLimits.env and .cwd do not combine with a sandbox (its environment "
            "is minimal plus Sandbox.env, its working directory its scratch directory); pass "
            "the variables as Sandbox(env={...})"
        )


def _kind(value: object) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _sequence(name: str, field_name: str, value: object, example: str) -> list[Any]:
    where = f"SubAgentDefinition({name!r}, "
    if isinstance(value, (str, bytes, AgentTool, Extension)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{where}{field_name}=...) must be a list, got {described(value)}; write "
            f"{field_name}=[{example}]"
        )
    return list(value)


def _tools(name: str, tools: Iterable[AgentTool | Callable[..., Any]]) -> tuple[AgentTool, ...]:
    where = f"SubAgentDefinition {name!r}"
    result: list[AgentTool] = []
    for index, item in enumerate(_sequence(name, "tools", tools, "my_tool, ...")):
        if isinstance(item, AgentTool):
            result.append(item)
        elif callable(item) and not isinstance(item, type):
            try:
                result.append(tool(item))
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"{where}: tools[{index}] ({_kind(item)}) is a plain function that cannot be "
                    f"made a tool: {exc}. Decorate it with @zett_agent.tools.tool, or build an "
                    "AgentTool yourself"
                ) from exc
        else:
            raise TypeError(
                f"{where}: tools[{index}] must be an AgentTool (or a plain function to wrap as "
                f"one), got {_kind(item)}"
            )
    repeated = repeated_names(t.name for t in result)
    if repeated:
        raise ValueError(f"{where}: two tools share a name: {', '.join(repeated)}")
    return tuple(result)


def _extensions(name: str, extensions: Iterable[Extension]) -> tuple[Extension, ...]:
    where = f"SubAgentDefinition {name!r}"
    result = _sequence(name, "extensions", extensions, "MyExtension(), ...")
    for index, item in enumerate(result):
        if not isinstance(item, Extension):
            hint = (
                "; pass an instance, MyExtension(), not the class"
                if isinstance(item, type) and issubclass(item, Extension)
                else ""
            )
            raise TypeError(
                f"{where}: extensions[{index}] must be an Extension instance, got "
                f"{_kind(item)}{hint}"
            )
    return tuple(result)


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
