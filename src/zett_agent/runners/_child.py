"""What a runner ships to a child, and what runs there: ``ChildSpec`` and ``run_child``.

The parent builds one ``ChildSpec`` per child: the definition, the model, the child's session
id, the prompt, and, only when the extension overrides ``_create_child``, the extension's
*class* and the picklable state its ``child_state()`` returned. The extension instance itself
never leaves the parent: its tasks, runner, pool, locks and clients stay there.

How the child's agent is built is the spec's own business, not the runner's: the spec carries
a picklable ``build`` (a ``ChildBuild``) that the extension named when it made the spec. In
the child, ``run_child`` calls it with the spec, a model that reports progress and ``emit``,
and gets a ``ChildRun`` back; it runs that, hands it the parent's messages, streams progress
through the runner's ``emit`` and returns a JSON-compatible report. This module knows only
that protocol (it imports nothing of ``zett_agent.extensions``). It is imported by every
child: keep it light.
"""

from __future__ import annotations

import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from zett_agent._model import Model, ModelEvent, ModelEventKind, ModelRequest, RetryOptions
from zett_agent._text import valid_text
from zett_agent._tracing import _tracer as _tracing

__all__ = [
    "ChildBuild",
    "ChildDefinition",
    "ChildRun",
    "ChildSpec",
    "ProgressModel",
    "rehearse",
    "run_child",
    "run_pickled_child",
    "set_default_build",
    "unpicklable_part",
]


class ChildDefinition(Protocol):
    """What a runner reads of a spec's definition (a ``SubAgentDefinition``).

    The runners use the name (in errors, for placement) and what ``unpicklable_part`` names;
    the rest of the definition is the build's.
    """

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> Model | None: ...
    @property
    def tools(self) -> Sequence[Any]: ...
    @property
    def extensions(self) -> Sequence[Any]: ...
    @property
    def limits(self) -> Any: ...


class ChildRun(Protocol):
    """One child's agent, built where the child runs and ready to run its prompt.

    ``take`` receives each message the parent sent (``ChildJob.send``), as ``run_child`` gets
    it; ``run`` runs the spec's prompt and returns the report's text; ``close`` releases what
    the child holds (its agent, the children it started), once, after ``run``.
    """

    def take(self, message: Any) -> None: ...
    async def run(self) -> str: ...
    async def close(self) -> None: ...


class ChildBuild(Protocol):
    """Builds a child where it runs: ``build(spec, model, emit)`` returns its ``ChildRun``.

    ``model`` is the spec's model wrapped to report progress; ``emit`` sends events to the
    parent. Carried by the spec (by reference: pickled with it), so it must be picklable.
    """

    def __call__(self, spec: ChildSpec, model: Model, emit: Callable[[Any], None]) -> ChildRun: ...


#: the build of a spec that names none (one made by hand: ``ChildSpec(definition, ...)``);
#: named by the module that defines the definitions, see ``set_default_build``
_default_build: list[ChildBuild] = []
#: makes the spec ``rehearse`` runs, named with the default build
_rehearsal: list[Callable[[], ChildSpec]] = []


def set_default_build(build: ChildBuild, rehearsal: Callable[[], ChildSpec] | None = None) -> None:
    """Name the build a spec without ``build`` gets.

    Called once by ``zett_agent.extensions._child_build`` as it is imported (by the subagent
    extensions, which every public path to ``SubAgentDefinition`` imports). A spec made
    without a ``build`` takes it when it is made (``ChildSpec.__post_init__``), so it ships its
    build by reference and the child imports the build's module as it unpickles the spec.
    ``rehearsal`` makes the spec ``rehearse`` runs with that build (a spare worker's warm-up).
    """
    _default_build[:] = [build]
    _rehearsal[:] = [] if rehearsal is None else [rehearsal]


def rehearse() -> str | None:
    """Run one child on a stand-in spec, start to report: the pool's warm-up.

    The process runner's pool names it as its ``warm_up``, which its launcher runs once before
    it forks any worker: what the first run of a child writes (the specialised bytecode of the
    agent's build, its loop, a turn, a tool call; caches built on first use) is then in pages
    every child shares, instead of in a copy each child makes as its first turn runs. The spec
    (``set_default_build``'s ``rehearsal``) holds no model of the user's and calls nothing
    outside the process; its events go nowhere; it leaves no thread. Returns the report's text
    (``None`` when no build named a rehearsal).
    """
    if not _rehearsal:
        return None
    import asyncio

    spec = _rehearsal[0]()
    report = asyncio.run(run_child(spec, emit=_discard))
    return str(report["content"])


def _discard(event: Any) -> None:
    return None


@dataclass(frozen=True)
class ChildSpec:
    """Everything one child needs, and nothing of the parent's runtime.

    A runner ships it to where the child runs (the process runner with cloudpickle) and calls
    ``run_child(spec, emit)`` there.

    Attributes:
        definition: The profile the child is built from (its model, tools, extensions).
        model: The child's model: the definition's, or a copy of the parent's when the
            definition says ``model=None``.
        session_id: The child's own session id (``"<parent session>/<task id>"``).
        prompt: The task the child works on.
        factory: The extension class whose ``_create_child`` builds the agent, when a subclass
            overrides it; ``None`` for the default build. Shipped by reference when its module
            is importable, by value (cloudpickle) when it lives in ``__main__``.
        state: What the extension's ``child_state()`` returned: the attributes ``self`` has
            inside ``_create_child`` in the child.
        build: What builds the child's agent where it runs (internal; set by the extension
            that makes the spec, see ``ChildBuild``); ``None``: the default build of a
            definition, the one ``factory`` and ``state`` describe.
        broker: Broker the child's model calls (internal; set by whoever builds the spec):
            the runner ships the child keyless stand-ins for every brokerable model in the
            spec and makes their calls in the parent (see ``zett_agent.runners._broker._parent``).
            ``ProcessRunner`` honours it, ``RayRunner`` refuses it, ``InProcessRunner``
            ignores it (its children share the parent's memory anyway).
        trace: Set by the parent when it traces this child (internal; see
            ``zett_agent._tracing._tracer.ChildTracing``): the W3C ``traceparent`` of the child's
            ``invoke_agent`` span, whether it records, and the parent process's identity.
        journal: Set for a durable child (internal): the journal it resumes from (empty for
            a new one), as JSON data the build reads (``zett_agent.extensions._child_build``).
            A runner ships it with the spec and never looks inside.
    """

    definition: ChildDefinition
    model: Model
    session_id: str
    prompt: str
    factory: type | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    broker: bool = False
    trace: Mapping[str, Any] | None = None
    build: ChildBuild | None = None
    journal: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.build is None and _default_build:
            object.__setattr__(self, "build", _default_build[0])


class ProgressModel:
    """Wraps the child's model and reports each call to the parent as a progress event.

    Progress rides on the model rather than on an extension so that it works whatever agent
    ``_create_child`` builds, as long as it uses the model it was given. Tool names the model
    made up are sent as valid Unicode (a lone surrogate replaced by U+FFFD): the engine refuses
    anything else, and the event is only progress.

    While a response streams, an ``{"kind": "alive"}`` event goes to the parent at most once
    per ``ALIVE_EVERY`` seconds: a sign of work for the parent's ``idle_seconds`` during a long
    model call.
    """

    #: seconds between two ``alive`` events of one streaming response
    ALIVE_EVERY = 1.0

    def __init__(self, inner: Model, emit: Callable[[Any], None]) -> None:
        self.inner = inner
        #: what it wraps, by the standard library's convention (spans name the inner model)
        self.__wrapped__ = inner
        self.retry: RetryOptions = inner.retry
        self._emit = emit
        #: the model calls so far (a resumed durable child starts from its journal's count)
        self.turn = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.turn += 1
        self._emit({"kind": "turn_started", "turn": self.turn})
        alive = time.monotonic() + self.ALIVE_EVERY
        async for event in self.inner.stream(request):
            if event.kind is ModelEventKind.COMPLETED and event.response is not None:
                usage = event.response.usage
                self._emit(
                    {
                        "kind": "turn_finished",
                        "turn": self.turn,
                        "tool_calls": [
                            valid_text(call.name) for call in event.response.message.tool_calls
                        ],
                        "input_tokens": usage.input_tokens if usage else 0,
                        "output_tokens": usage.output_tokens if usage else 0,
                    }
                )
            elif time.monotonic() >= alive:
                self._emit({"kind": "alive"})
                alive = time.monotonic() + self.ALIVE_EVERY
            yield event


def _build_of(spec: ChildSpec) -> ChildBuild:
    if spec.build is not None:
        return spec.build
    if not _default_build:
        raise TypeError(
            "this ChildSpec names no build and none is known: give it a "
            "zett_agent.extensions.subagent.SubAgentDefinition"
        )
    return _default_build[0]


async def run_child(
    spec: ChildSpec,
    emit: Callable[[Any], None] | None = None,
    receive: Callable[[], Awaitable[Any]] | None = None,
) -> dict[str, Any]:
    """Build the child agent, run its prompt, return ``{"content": ..., "seconds": ...}``.

    The entry point every runner calls where the child runs. Progress events (JSON-compatible
    dicts) go to ``emit`` (default: ``zett_agent.process.emit``, the process pool's pipe).
    ``receive`` returns the next message the parent sent the child (its ``ChildJob.send``);
    each goes to the child's ``ChildInbox`` (``_child_inbox``), which delivers it before the
    next model call and confirms it with an event. Default: the process pool's inbox when
    ``emit`` is the default too, else no messages (a runner that delivers messages passes
    its own ``receive``).
    The report is valid Unicode: a lone surrogate the child's model produced is replaced by
    U+FFFD, so the child's work reaches the parent (the engine refuses invalid Unicode).
    The spec's build (``ChildBuild``) makes the child; what it holds (its agent, the
    children a child started of its own) is closed before this returns, so no grandchild
    outlives its parent's report.

    Raises whatever the child agent raises; a runner reports it to the parent as a failure
    (the process runner as ``JobFailed``).
    """
    import asyncio

    from zett_agent.runners._child_inbox import receive_forever

    if emit is None:
        from zett_agent.process import emit as to_parent

        emit = to_parent
        if receive is None:
            receive = _pool_inbox

    started = time.monotonic()
    model = ProgressModel(spec.model, emit)
    child = _build_of(spec)(spec, model, emit)
    # spans go to the parent as events (or nowhere); the receiver's requests are traced too
    with _tracing.ChildTracing(spec.trace, emit):
        receiver = None
        if receive is not None:
            receiver = asyncio.get_running_loop().create_task(
                receive_forever(receive, child.take), name="zett-agent-child-inbox"
            )
        emit({"kind": "started"})
        try:
            content = await child.run()
        finally:
            if receiver is not None:
                receiver.cancel()
                await asyncio.wait({receiver})
            await child.close()
    return {"content": valid_text(content), "seconds": time.monotonic() - started}


async def _pool_inbox() -> Any:
    from zett_agent.process._child._inbox import receive
    from zett_agent.runners._child_inbox import MESSAGE_TOPIC

    return await receive(MESSAGE_TOPIC)


async def run_pickled_child(
    payload: bytes,
    emit: Callable[[Any], None] | None = None,
    *,
    forget: Sequence[str] = (),
) -> dict[str, Any]:
    """Run a child from a spec the runner pickled itself.

    ``run_child`` on a spec the runner pickled itself (a brokered spec: its models were
    replaced by stand-ins as it was pickled, see ``zett_agent.runners._broker._parent``).
    First, before the spec is unpickled, the provider key variables (the defaults and
    ``forget``) are unset and wiped from this process's memory (``_broker._keys``): the parent
    makes this child's calls.
    """
    import cloudpickle

    from zett_agent.runners._broker._keys import KEY_VARIABLES
    from zett_agent.runners._broker._keys import forget as forget_keys
    from zett_agent.runners._broker._standin import relay_from_here

    forget_keys((*KEY_VARIABLES, *forget))
    spec = cloudpickle.loads(payload)
    if not isinstance(spec, ChildSpec):
        raise TypeError(f"run_pickled_child() takes a pickled ChildSpec, got {type(spec).__name__}")
    relay_from_here()  # the children this child starts are brokered through its own broker
    return await run_child(spec, emit)


# -- naming what cannot be pickled ------------------------------------------------------------


def unpicklable_part(spec: ChildSpec) -> str | None:
    """Name the first part of ``spec`` that cloudpickle refuses, with its error; else ``None``.

    Used after pickling the whole spec failed, to tell the user which object to fix. Any
    runner that pickles specs (processes, a cluster) can use it.
    """
    import cloudpickle

    for label, value in _parts(spec):
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            if isinstance(value, type):
                inner = _unpicklable_global(value)
                if inner is not None:
                    label = f"{label}, through {inner}"
            return f"{label} cannot be pickled ({type(exc).__name__}: {exc})"
    return None


def _parts(spec: ChildSpec) -> Iterator[tuple[str, object]]:
    definition = spec.definition
    where = f"definition {definition.name!r}"
    if spec.factory is not None:
        yield (
            f"the extension class {spec.factory.__qualname__} (sent because it overrides "
            "_create_child)",
            spec.factory,
        )
    for key, value in spec.state.items():
        yield f"child_state()[{key!r}] ({_describe(value)})", value
    if definition.model is not None:
        yield f"the model of {where} ({_describe(definition.model)})", definition.model
    else:
        yield (
            f"the parent's model ({_describe(spec.model)}), which {where} uses through model=None",
            spec.model,
        )
    for tool in definition.tools:
        yield f"tool {tool.name!r} of {where}", tool
    for index, extension in enumerate(definition.extensions):
        yield f"extensions[{index}] of {where} ({_describe(extension)})", extension
    yield f"the limits of {where}", definition.limits
    if spec.build is not None:
        yield f"the build of the spec ({_describe(spec.build)})", spec.build


def _unpicklable_global(cls: type) -> str | None:
    """Name the global that makes a class unpicklable.

    ``"the global 'metrics' used by X.task_finished"`` when a class pickled by value
    refers to a module global that cannot be pickled.
    """
    import cloudpickle

    for klass in cls.__mro__:
        for attribute, value in vars(klass).items():
            function = getattr(value, "__func__", value)
            if not isinstance(function, types.FunctionType):
                continue
            for name in function.__code__.co_names:
                if name not in function.__globals__:
                    continue
                try:
                    cloudpickle.dumps(function.__globals__[name])
                except Exception:
                    return f"the global {name!r} used by {klass.__qualname__}.{attribute}"
    return None


def _describe(value: object) -> str:
    text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
