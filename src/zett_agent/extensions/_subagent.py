"""The foreground ``SubAgentExtension`` and what both subagent extensions share."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from zett_agent._checks import described, repeated_names
from zett_agent._runtime._extension import Extension
from zett_agent._tracing import _tracer
from zett_agent.extensions._child_build import build_child, default_agent
from zett_agent.extensions._definition import (
    SubAgentDefinition,
    check_combination,
    default_subagents,
)
from zett_agent.extensions._preload import brokerable_models, child_modules
from zett_agent.process import ProcessLimits, Sandbox
from zett_agent.process._sandbox._options import check_sandbox
from zett_agent.runners._base import ChildJob, ChildRunner
from zett_agent.runners._child import ChildSpec, ProgressModel
from zett_agent.runners._report import failure_reason, report_content
from zett_agent.tools import AgentTool

if TYPE_CHECKING:
    from zett_agent._model import Model
    from zett_agent.agent import Agent, AgentRunContext
    from zett_agent.process import ProcessPool
    from zett_agent.runners._process import ProcessRunner
    from zett_agent.runners._span_relay import ChildTrace


class ChildAgentExtension(Extension):
    """Shared base: holds the definitions and the runner, and builds child agents.

    What a child receives is a ``ChildSpec`` (definition, model, session id, prompt, and the
    extension *class* plus ``child_state()`` when ``_create_child`` is overridden), never this
    object: the registry, the runner, its pool, and whatever a subclass keeps on ``self``
    (locks, clients, metrics) stay in the parent.

    An instance is pickled only when it is itself part of a definition (a child that starts
    children of its own): then its configuration travels, its runtime state (tasks, pool) does
    not, and the copy creates its own pool in the child on first use.
    """

    def __init__(
        self,
        subagents: Sequence[SubAgentDefinition] | None = None,
        *,
        runner: ChildRunner | None = None,
        pool: ProcessPool | None = None,
        limits: ProcessLimits | None = None,
        kill_grace: float | None = None,
        max_children: int | None = None,
        max_workers: int | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        super().__init__()
        where = f"{type(self).__name__}(subagents=...)"
        if isinstance(subagents, SubAgentDefinition):
            raise TypeError(
                f"{where} must be a list of SubAgentDefinition, got one SubAgentDefinition; "
                "write [definition]"
            )
        definitions = tuple(default_subagents() if subagents is None else subagents)
        if not definitions:
            raise ValueError(
                f"{where} must hold at least one SubAgentDefinition (or be None for the "
                "built-ins), got an empty list"
            )
        for index, definition in enumerate(definitions):
            if not isinstance(definition, SubAgentDefinition):
                raise TypeError(
                    f"{where} must be a list of SubAgentDefinition, got {described(definition)} "
                    f"at index {index}"
                )
        duplicates = repeated_names(d.name for d in definitions)
        if duplicates:
            raise ValueError(
                f"{where} must have unique names, got {', '.join(duplicates)} more than once"
            )
        if limits is not None and not isinstance(limits, ProcessLimits):
            raise TypeError(
                f"{type(self).__name__}(limits=...) must be a zett_agent.process.ProcessLimits "
                f"or None, got {described(limits)}; write limits=ProcessLimits(timeout=...)"
            )
        sandbox = check_sandbox(sandbox, f"{type(self).__name__}(sandbox=...)")
        for definition in definitions:
            check_combination(
                definition.limits or limits,
                definition.sandbox or sandbox,
                f"SubAgentDefinition {definition.name!r} with this extension's defaults",
            )
        if max_workers is not None:  # the option's earlier name
            if max_children is not None:
                raise ValueError("give max_children (max_workers is its older name), not both")
            max_children = max_workers
        if runner is None:
            from zett_agent.runners._process import ProcessRunner

            runner = ProcessRunner(pool, max_children=max_children, kill_grace=kill_grace)
            runner.owner = type(self).__name__  # named in the warning if never closed
        else:
            given = [
                name
                for name, value in (
                    ("pool", pool),
                    ("kill_grace", kill_grace),
                    ("max_children", max_children),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)} configure the default ProcessRunner; with runner=, "
                    f"pass them to the runner instead: ProcessRunner({given[0]}=...)"
                )
            if not isinstance(runner, ChildRunner):
                raise TypeError(
                    "runner must implement zett_agent.runners.ChildRunner (warm_up, submit, "
                    f"close), such as ProcessRunner() or InProcessRunner(); got {runner!r}"
                )
            if _is_process_runner(runner):
                runner.owner = type(self).__name__
        self.subagents: tuple[SubAgentDefinition, ...] = definitions
        self.limits = limits
        #: the sandbox of the children whose definition sets none
        self.sandbox = sandbox
        # name-mangled, here and in the subclasses: a subclass's own attributes never meet
        # the extension's internals (the runner is configuration and travels when the
        # extension is pickled; the core is this process's runtime and does not)
        self.__runner: ChildRunner = runner
        self.__core = ChildCore(runner)

    @property
    def runner(self) -> ChildRunner:
        """Where this extension's children run (``ProcessRunner`` unless ``runner=`` said)."""
        return self.__runner

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_ChildAgentExtension__core", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__core = ChildCore(self.__runner)
        if _is_process_runner(self.__runner):
            self.__runner.owner = type(self).__name__

    def definition(self, subagent_type: str) -> SubAgentDefinition:
        """Return the profile named ``subagent_type``; ``ValueError`` lists the valid names."""
        for definition in self.subagents:
            if definition.name == subagent_type:
                return definition
        known = ", ".join(repr(d.name) for d in self.subagents)
        raise ValueError(
            f"unknown subagent_type {short_repr(subagent_type)}; choose one of: {known}"
        )

    # -- building children ------------------------------------------------------------------

    def _create_child(
        self, definition: SubAgentDefinition, *, model: Model, session_id: str
    ) -> Agent:
        """Build one child agent. Runs in the child's own process (where the child runs).

        Override to change how children are built (extra tools, extensions, prompts, OS
        controls applied inside the child). Use the ``model`` given (the definition's model, or
        the parent's, wrapped to report progress) and return an ordinary ``Agent``.

        ``self`` here is not the parent's extension: it is a fresh instance of your class,
        made in the child without calling ``__init__``, whose only attributes are those
        ``child_state()`` returned in the parent. Nothing of the parent's runtime is there
        (tasks, runner, pool, the subclass's locks or clients). The class travels by reference
        when its module is importable, by value (cloudpickle) when it lives in ``__main__``.
        """
        return default_agent(definition, model)

    def child_state(self) -> Mapping[str, Any]:
        """Return the picklable configuration ``_create_child`` needs in the child.

        Called in the parent at each start, only when the class overrides ``_create_child``.
        Each item becomes an attribute of ``self`` inside ``_create_child`` (which runs in the
        child). The default is empty. Example: ``return {"umask": self.umask}``.
        """
        return {}

    async def close(self) -> None:
        """Close the runner (a shared ``ProcessPool`` is left open). Idempotent."""
        await self.__runner.close()


class ChildCore:
    """What a subagent extension keeps in the process it runs in, to start children.

    The runner it submits to, how many children it numbered, and the modules its children
    import per parent model type (told to the runner ahead). The extension holds it
    name-mangled (``child_core`` reads it); methods take the extension, whose public options
    (``subagents``, ``limits``, ``sandbox``, ``child_state()``) they read as they are now.
    """

    def __init__(self, runner: ChildRunner) -> None:
        self.runner = runner
        #: numbers the children this extension started
        self.counter = 0
        self.modules: dict[type, tuple[str, ...]] = {}
        #: the brokerable models the children use, per parent model type (for a process runner)
        self.models: dict[type, tuple[Any, ...]] = {}

    def next_number(self) -> int:
        """The number of the next child this extension starts (1, 2, ...)."""
        self.counter += 1
        return self.counter

    def warm_up(self, extension: ChildAgentExtension, parent_model: Model | None) -> None:
        """Tell the runner what the coming children import (computed once per model type).

        A ``ProcessRunner`` is told of the brokerable models too, which it calls for its
        brokered children in this process and so warms up here.
        """
        if isinstance(parent_model, ProgressModel):
            parent_model = parent_model.inner
        key = type(parent_model)
        modules = self.modules.get(key)
        if modules is None:
            modules = self.modules[key] = child_modules(
                extension.subagents,
                parent_model,
                factory_of(extension),
                brokered=getattr(self.runner, "broker", False) is True,
            )
        if not _warms_models(self.runner):
            self.runner.warm_up(modules)
            return
        models = self.models.get(key)
        if models is None:
            models = self.models[key] = brokerable_models(extension.subagents, parent_model)
        self.runner.warm_up(modules, models=models)

    async def launch(
        self,
        extension: ChildAgentExtension,
        parent_model: Model,
        definition: SubAgentDefinition,
        *,
        session_id: str,
        prompt: str,
        trace: ChildTrace | None,
        journal: Mapping[str, Any] | None = None,
        check: Callable[[ChildSpec], None] | None = None,
    ) -> ChildJob:
        """Start one child on the runner: its spec (carrying ``trace`` when tracing), submitted.

        Hands the child to the runner with its limits and, when it has one, its sandbox (a
        runner written before sandboxes takes the rest unchanged). ``journal`` makes it a
        durable child (see ``ChildSpec.journal``); ``check`` sees the spec before it is
        submitted. Raises what ``child_spec``, ``check`` and the runner's ``submit`` raise
        (``TypeError`` for a definition that cannot be shipped, naming the part).
        """
        self.warm_up(extension, parent_model)
        spec = child_spec(
            extension,
            parent_model,
            definition,
            session_id=session_id,
            prompt=prompt,
            journal=journal,
        )
        if check is not None:
            check(spec)
        if trace is not None:
            spec = trace.ship(spec)
        sandbox = definition.sandbox or extension.sandbox
        limits = definition.limits or extension.limits
        if sandbox is None:
            return await self.runner.submit(spec, limits=limits)
        return await self.runner.submit(spec, limits=limits, sandbox=sandbox)


def child_core(extension: ChildAgentExtension) -> ChildCore:
    """The ``ChildCore`` of ``extension`` (for the subagent extensions' own modules)."""
    core: ChildCore = vars(extension)["_ChildAgentExtension__core"]
    return core


def factory_of(extension: ChildAgentExtension) -> type[ChildAgentExtension] | None:
    """The extension's class when it overrides ``_create_child`` (shipped to build the child)."""
    cls = type(extension)
    return cls if cls._create_child is not ChildAgentExtension._create_child else None


def child_spec(
    extension: ChildAgentExtension,
    parent_model: Model,
    definition: SubAgentDefinition,
    *,
    session_id: str,
    prompt: str,
    journal: Mapping[str, Any] | None = None,
) -> ChildSpec:
    """The ``ChildSpec`` of one child of ``extension`` (``journal``: a durable one).

    Its model (the definition's, or the parent's own one: never a progress wrapper), and the
    class and ``child_state()`` of an extension that overrides ``_create_child``.
    """
    if isinstance(parent_model, ProgressModel):  # a child starting children of its own
        parent_model = parent_model.inner
    model = definition.model if definition.model is not None else parent_model
    factory = factory_of(extension)
    state: Mapping[str, Any] = {}
    if factory is not None:
        state = dict(extension.child_state())
        bad = [key for key in state if not isinstance(key, str) or not key.isidentifier()]
        if bad:
            raise TypeError(f"child_state() must map attribute names to values; bad keys: {bad!r}")
    return ChildSpec(
        definition, model, session_id, prompt, factory, state, build=build_child, journal=journal
    )


def profiles_text(subagents: Sequence[SubAgentDefinition]) -> str:
    """The profiles for a tool's description: ``name: description; ...``."""
    return "; ".join(f"{d.name}: {d.description}" for d in subagents)


class SubAgentExtension(ChildAgentExtension):
    """Run one child agent and block the calling tool until it reports.

    Registers the tool ``subagent`` (``subagent_type``, ``description``, ``prompt``). The child
    is an ordinary agent with its own session, built from a ``SubAgentDefinition`` in its own
    process (or wherever ``runner=`` runs it; see ``AsyncSubAgentExtension`` for the options);
    its report is the tool's result. A failed child gives a failed tool result with a one-line
    reason.

    Cancellation: cancelling the parent's request kills the child's whole process tree and
    waits until it is gone before the cancellation propagates.
    """

    tool_name = "subagent"

    async def on_tool(self, context: AgentRunContext) -> None:
        child_core(self).warm_up(self, context.model)
        context.register_tool(self.build_tool(context))

    def build_tool(self, context: AgentRunContext) -> AgentTool:
        """Return the blocking ``subagent`` tool for one request."""

        async def subagent(subagent_type: str, description: str, prompt: str) -> str:
            return await self.run_child(context, subagent_type, description, prompt)

        return AgentTool(
            name=self.tool_name,
            description=(
                "Run a subagent in its own process and wait for its report. Profiles: "
                + profiles_text(self.subagents)
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

        Raises ``ValueError`` for an unknown profile or empty prompt, ``TypeError`` when the
        definition cannot be shipped to the child (naming the part), and ``RuntimeError`` with
        a one-line reason when the child fails.
        """
        definition = self.definition(subagent_type)
        if not prompt.strip():
            raise ValueError("prompt is empty; give the subagent the full task to work on")
        core = child_core(self)
        session_id = f"{context.session_id}/subagent-{core.next_number()}"
        trace = open_child_trace(
            definition, session_id.rsplit("/", 1)[-1], session_id, description, context.model
        )
        try:
            job = await core.launch(
                self, context.model, definition, session_id=session_id, prompt=prompt, trace=trace
            )
        except BaseException as exc:
            if trace is not None:
                trace.abandon(exc)
            raise
        follower = trace.follow(job) if trace is not None else None
        try:
            await job.wait()
        except asyncio.CancelledError:
            await asyncio.shield(job.cancel())
            raise
        finally:
            if trace is not None:
                await trace.finish(job, follower)
        error = job.exception()
        if error is not None:
            raise RuntimeError(f"subagent {description!r} failed: {failure_reason(error)}")
        return report_content(job.result())

    async def close(self) -> None:
        """Close the runner (a shared ``ProcessPool`` is left open). Idempotent."""
        await self.runner.close()

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


def open_child_trace(
    definition: SubAgentDefinition,
    agent_id: str,
    session_id: str,
    description: str,
    parent_model: Model,
) -> ChildTrace | None:
    """The ``invoke_agent`` span of a child about to start, or ``None`` when nothing is traced.

    See ``zett_agent.runners._span_relay.child_trace``. The relay is imported only when
    something is traced: a program that traces nothing never loads it.
    """
    if _tracer.current() is None:
        return None
    from zett_agent.runners._span_relay import child_trace

    return child_trace(
        definition.name,
        agent_id,
        session_id,
        description,
        agent_description=definition.description,
        model=definition.model if definition.model is not None else parent_model,
    )


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


def warm_up(extension: ChildAgentExtension, parent_model: Model | None) -> None:
    """Tell ``extension``'s runner now what its coming children will import.

    ``parent_model`` is the model of the agent the extension serves, or ``None`` where there
    is none (the MCP server): then only what the definitions' own models import counts.
    """
    child_core(extension).warm_up(extension, parent_model)


def _warms_models(runner: object) -> TypeGuard[ProcessRunner]:
    """Whether ``runner``'s ``warm_up`` is ``ProcessRunner``'s own, which takes ``models=``.

    A subclass that overrides it is called as any ``ChildRunner`` is (``warm_up(modules)``).
    """
    module = sys.modules.get("zett_agent.runners._process")
    return module is not None and (
        getattr(type(runner), "warm_up", None) is module.ProcessRunner.warm_up
    )


def _is_process_runner(runner: object) -> TypeGuard[ProcessRunner]:
    """Whether ``runner`` is a ``ProcessRunner``, without importing its module.

    A child that unpickles an extension (a subclass shipped to build its agent) imports this
    module: it must not import the process runner's host side, the engine and psutil with it.
    A runner of that class exists only once its module was imported.
    """
    module = sys.modules.get("zett_agent.runners._process")
    return module is not None and isinstance(runner, module.ProcessRunner)
