"""Where child agents run: the runner interface and the runners that implement it.

A subagent extension (``AsyncSubAgentExtension``, ``SubAgentExtension``) hands each child to its
runner, chosen with ``runner=``::

    from zett_agent.runners import InProcessRunner, ProcessRunner

    AsyncSubAgentExtension(definitions)                                  # ProcessRunner()
    AsyncSubAgentExtension(definitions, runner=ProcessRunner(max_children=64))
    AsyncSubAgentExtension(definitions, runner=InProcessRunner())        # no processes

- ``ProcessRunner`` (the default): each child in its own OS process of a
  ``zett_agent.process.ProcessPool``; hard kill of the whole process tree, every
  ``ProcessLimits`` field, crash isolation, CPU parallelism. Linux only.
- ``InProcessRunner``: each child as an asyncio task of the parent's event loop. For
  development where the engine cannot run, and tests. No hard kill, no isolation: a crash takes
  the parent down (see its docstring).
- A Ray runner, ``zett_agent.runners.ray.RayRunner``, behind the same interface (optional;
  importing ``zett_agent`` never imports Ray).

Writing a runner: implement ``ChildRunner`` (``warm_up``, ``submit``, ``close``) returning
``ChildJob`` objects; ship the ``ChildSpec`` to where the child runs and call ``run_child(spec,
emit)`` there. ``unpicklable_part(spec)`` names what could not be shipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zett_agent._lazy import lazy_names as _lazy_names

if TYPE_CHECKING:
    from zett_agent.runners._base import ChildJob, ChildRunner
    from zett_agent.runners._child import ChildSpec, run_child, unpicklable_part
    from zett_agent.runners._inprocess import InProcessJob, InProcessRunner
    from zett_agent.runners._process import (
        DEFAULT_MAX_CHILDREN,
        DEFAULT_NICE,
        ProcessChildJob,
        ProcessRunner,
    )

#: public name -> the module it lives in (imported on first access: a child imports
#: ``runners._child`` without the runners' host sides, their engine and its dependencies)
_HOMES: dict[str, str] = {
    "ChildJob": "zett_agent.runners._base",
    "ChildRunner": "zett_agent.runners._base",
    "ChildSpec": "zett_agent.runners._child",
    "DEFAULT_MAX_CHILDREN": "zett_agent.runners._process",
    "DEFAULT_NICE": "zett_agent.runners._process",
    "InProcessJob": "zett_agent.runners._inprocess",
    "InProcessRunner": "zett_agent.runners._inprocess",
    "ProcessChildJob": "zett_agent.runners._process",
    "ProcessRunner": "zett_agent.runners._process",
    "run_child": "zett_agent.runners._child",
    "unpicklable_part": "zett_agent.runners._child",
}

__all__ = [
    "DEFAULT_MAX_CHILDREN",
    "DEFAULT_NICE",
    "ChildJob",
    "ChildRunner",
    "ChildSpec",
    "InProcessJob",
    "InProcessRunner",
    "ProcessChildJob",
    "ProcessRunner",
    "run_child",
    "unpicklable_part",
]

__getattr__, __dir__ = _lazy_names(__name__, _HOMES, globals())
