"""Which modules the children of an extension will import, so a runner can import them ahead.

The extension finds them (it knows what a definition holds) and hands the runner a tuple of
module names; the runner only imports names (``zett_agent.runners._preload``).

A child process unpickles its definition: every tool, model and extension class pickled by
reference makes it import that object's module. Importing them once in the process pool's
launcher, before it forks, means no child pays for the import (time, and memory it could have
shared): behind a web app a child re-importing the app module took a second; a child on
``OpenAIChatModel`` importing its HTTP stack (then httpx) used 12.5 MiB of its own memory
instead of 7.

Found automatically: the modules of each definition's model (or the parent's, for
``model=None``), tools (the function behind the ``AgentTool``), extensions (their classes, and
the definitions of a nested subagent extension), the extension subclass that builds children,
and the extra modules a class names in a ``child_preload`` attribute (a model adapter lists
there what its first request would import or build, such as the process's TLS context).
Never ``__main__``, never a module cloudpickle ships by value, never a module that was not
imported under its own name.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from zett_agent.extensions._definition import StartsChildren, SubAgentDefinition
from zett_agent.runners._broker._standin import BrokeredModel
from zett_agent.runners._preload import excluded

__all__ = ["brokerable_models", "child_modules"]


def child_modules(
    definitions: Sequence[SubAgentDefinition],
    parent_model: Any,
    factory: type | None,
    *,
    brokered: bool = False,
) -> tuple[str, ...]:
    """The importable modules the children of these definitions will import, in a stable order.

    ``parent_model`` is the model a definition with ``model=None`` gets; ``factory`` the
    extension class shipped to build children (``None`` for the default build). ``brokered``:
    the runner brokers the children's model calls, so a brokerable model stands for its
    stand-in (``BrokeredModel``): its adapter, SDK and HTTP client are not what a child imports.
    """
    found: dict[str, None] = {}
    for obj in _objects(definitions, parent_model, factory, depth=0):
        if brokered and getattr(type(obj), "brokerable", False) is True:
            obj = BrokeredModel
        for name in _modules_of(obj):
            if name not in found and _importable(name):
                found[name] = None
        for name in _declared(obj):  # named by the class itself: trusted to be importable
            if name != "__main__":
                found.setdefault(name, None)
    return tuple(found)


def brokerable_models(
    definitions: Sequence[SubAgentDefinition], parent_model: Any
) -> tuple[Any, ...]:
    """The brokerable models the children of these definitions use, at any depth (each once).

    Those a brokering runner calls for them in this process (``parent_model`` stands for a
    definition's ``model=None``), so it can warm them up ahead (``ProcessRunner.warm_up``).
    """
    found: dict[int, Any] = {}
    for obj in _objects(definitions, parent_model, None, depth=0):
        if not isinstance(obj, type) and getattr(type(obj), "brokerable", False) is True:
            found.setdefault(id(obj), obj)
    return tuple(found.values())


def _objects(
    definitions: Sequence[SubAgentDefinition], parent_model: Any, factory: type | None, depth: int
) -> Iterator[Any]:
    if factory is not None:
        yield factory
    for definition in definitions:
        model = definition.model if definition.model is not None else parent_model
        if model is not None:
            yield model
        for tool in definition.tools:
            yield inspect.unwrap(tool.handler)
        for extension in definition.extensions:
            yield extension
            if isinstance(extension, StartsChildren) and depth < 8:
                # a child that starts children: their modules are imported in its tree too
                yield from _objects(extension.subagents, model, None, depth + 1)


def _modules_of(obj: Any) -> Iterator[str]:
    cls = obj if isinstance(obj, type) else type(obj)
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        name = getattr(obj, "__module__", None)
        if name:
            yield name
    else:
        for klass in cls.__mro__:
            if klass.__module__ != "builtins":
                yield klass.__module__


def _declared(obj: Any) -> list[str]:
    cls = obj if isinstance(obj, type) else type(obj)
    extra = getattr(cls, "child_preload", ())
    if not isinstance(extra, (tuple, list)):
        return []
    return [name for name in extra if isinstance(name, str)]


def _importable(name: str) -> bool:
    if name == "__main__" or name.startswith("__main__.") or name == "builtins":
        return False
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is None or spec is None or spec.name != name:
        return False  # not imported by that name (a file run as a script, a synthetic module)
    try:
        import cloudpickle

        by_value = cloudpickle.list_registry_pickle_by_value()
    except Exception:  # pragma: no cover - cloudpickle is a dependency
        by_value = set()
    return not excluded(name, by_value)
