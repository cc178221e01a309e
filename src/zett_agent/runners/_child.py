"""What a runner ships to a child, and what runs there: ``ChildSpec`` and ``run_child``.

The parent builds one ``ChildSpec`` per child: the definition, the model, the child's session
id, the prompt, and, only when the extension overrides ``_create_child``, the extension's
*class* and the picklable state its ``child_state()`` returned. The extension instance itself
never leaves the parent: its tasks, runner, pool, locks and clients stay there.

In the child, ``run_child`` builds the agent through ``_create_child`` (on a fresh instance of
the extension class made without ``__init__``, holding only the ``child_state()``), runs the
prompt, streams progress through the runner's ``emit`` and returns a JSON-compatible report.
This module is imported by every child: keep it light.
"""

from __future__ import annotations

import time
import types
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zett_agent._model import Model, ModelEvent, ModelEventKind, ModelRequest, RetryOptions
from zett_agent._text import valid_text

if TYPE_CHECKING:
    from zett_agent.agent import Agent
    from zett_agent.extensions._definition import SubAgentDefinition
    from zett_agent.extensions._subagent import ChildAgentExtension

__all__ = ["ChildSpec", "ProgressModel", "run_child", "run_pickled_child", "unpicklable_part"]


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
        broker: Broker the child's model calls (internal; set by whoever builds the spec):
            the runner ships the child keyless stand-ins for every brokerable model in the
            spec and makes their calls in the parent (see ``zett_agent.runners._broker``).
            ``ProcessRunner`` honours it, ``RayRunner`` refuses it, ``InProcessRunner``
            ignores it (its children share the parent's memory anyway).
    """

    definition: SubAgentDefinition
    model: Model
    session_id: str
    prompt: str
    factory: type[ChildAgentExtension] | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    broker: bool = False


class ProgressModel:
    """Wraps the child's model and reports each call to the parent as a progress event.

    Progress rides on the model rather than on an extension so that it works whatever agent
    ``_create_child`` builds, as long as it uses the model it was given. Tool names the model
    made up are sent as valid Unicode (a lone surrogate replaced by U+FFFD): the engine refuses
    anything else, and the event is only progress.
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
                        "tool_calls": [
                            valid_text(call.name) for call in event.response.message.tool_calls
                        ],
                        "input_tokens": usage.input_tokens if usage else 0,
                        "output_tokens": usage.output_tokens if usage else 0,
                    }
                )
            yield event


def build_agent(spec: ChildSpec, model: Model) -> Agent:
    """Build the child's agent with ``_create_child``, as the spec says (runs in the child)."""
    from zett_agent.extensions._subagent import ChildAgentExtension

    factory = spec.factory or ChildAgentExtension
    builder = factory._child_instance(spec.state)
    return builder._create_child(spec.definition, model=model, session_id=spec.session_id)


async def run_child(spec: ChildSpec, emit: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Build the child agent, run its prompt, return ``{"content": ..., "seconds": ...}``.

    The entry point every runner calls where the child runs. Progress events (JSON-compatible
    dicts) go to ``emit`` (default: ``zett_agent.process.emit``, the process pool's pipe).
    The report is valid Unicode: a lone surrogate the child's model produced is replaced by
    U+FFFD, so the child's work reaches the parent (the engine refuses invalid Unicode).
    Subagent extensions of the child (a child that starts children of its own) are closed
    before it returns, so no grandchild outlives its parent's report.

    Raises whatever the child agent raises; a runner reports it to the parent as a failure
    (the process runner as ``JobFailed``).
    """
    from zett_agent.agent import AgentRunConfig

    if emit is None:
        from zett_agent.process import emit as to_parent

        emit = to_parent

    started = time.monotonic()
    model = ProgressModel(spec.model, emit)
    agent = build_agent(spec, model)
    config = AgentRunConfig(session_id=spec.session_id)
    if spec.definition.max_turns is not None:
        config = AgentRunConfig(session_id=spec.session_id, max_turns=spec.definition.max_turns)
    emit({"kind": "started"})
    try:
        result = await agent.run(spec.prompt, config=config)
    finally:
        await agent.close()
        await _close_subagent_extensions(agent)
    return {"content": valid_text(result.content), "seconds": time.monotonic() - started}


async def run_pickled_child(
    payload: bytes, emit: Callable[[Any], None] | None = None
) -> dict[str, Any]:
    """``run_child`` on a spec the runner pickled itself (a brokered spec: its models were
    replaced by stand-ins as it was pickled, see ``zett_agent.runners._broker``)."""
    import cloudpickle

    from zett_agent.runners._standin import relay_from_here

    spec = cloudpickle.loads(payload)
    if not isinstance(spec, ChildSpec):
        raise TypeError(f"run_pickled_child() takes a pickled ChildSpec, got {type(spec).__name__}")
    relay_from_here()  # the children this child starts are brokered through its own broker
    return await run_child(spec, emit)


async def _close_subagent_extensions(agent: Agent) -> None:
    from zett_agent.extensions._subagent import ChildAgentExtension

    for extension in agent.extensions:
        if isinstance(extension, ChildAgentExtension):
            await extension.close()


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


def _unpicklable_global(cls: type) -> str | None:
    """``"the global 'metrics' used by X.task_finished"`` when a class pickled by value
    refers to a module global that cannot be pickled."""
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
