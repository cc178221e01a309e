"""``RayRunner``: child agents as Ray tasks, on one machine or a cluster (the ``ray`` extra).

::

    from zett_agent.runners.ray import RayRunner

    runner = RayRunner(address=None)     # None: start a local Ray; "auto", "ray://host:port"
    runner.connect()                     # optional: connect now rather than at the first child
    extension = AsyncSubAgentExtension(definitions, runner=runner)

Each child is one Ray generator task (``max_retries=0``: a child with side effects never runs
twice unless asked), and runs in a fresh process of a ``ProcessPool`` that its Ray worker keeps
for its whole life: the child's code never runs in the Ray worker, and it gets what the engine
gives every job on that node (its containment, a Landlock domain that keeps it from signalling
or tracing anything outside its tree, its limits, its sandbox, bounded decoding of what it
sends). The task passes what the pool decoded on to the parent as the engine's frames, which
the parent decodes again within its own budgets. Jobs offer the runner interface
(``events()``, ``done()``, ``wait()``, ``result()``, ``exception()``, ``cancel()``,
``usage()``, ``pid``, ``info()``) plus ``node_id``. ``submit_function`` runs any function the
same way (``emit`` streams its events).

Cancel and timeout ask the task to stop (``ray.cancel(force=False)``): its node's pool kills
the child's tree and the task confirms it. Without that confirmation in time, the parent kills
the Ray worker, its pool and every tree in it from outside (from this process when the node is
this machine, else through the node's reaper actor, replaced when it does not answer).

Typed outcomes, as with processes: ``JobFailed``, ``WorkerCrashed`` (the child's process died;
the signal name from its exit status), ``JobTimeout`` (enforced from the parent),
``LimitExceeded``, ``ProtocolError``, ``SandboxUnavailable``, ``JobCancelled``,
``PoolClosed`` (the runner was closed), and ``NodeLost`` (the node running the child died or
left the cluster, or the cluster went away).

Importing this module imports Ray only when ``RayRunner`` or ``RayJob`` is first used: a child
that imports ``emit`` from here pays nothing for it. See ``docs/ray.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zett_agent.process import emit
from zett_agent.runners._ray._ray_errors import NodeLost

if TYPE_CHECKING:
    from zett_agent.runners._ray._ray_job import RayJob
    from zett_agent.runners._ray._ray_runner import RayRunner

__all__ = ["NodeLost", "RayJob", "RayRunner", "emit"]


def __getattr__(name: str) -> Any:
    if name == "RayRunner":
        from zett_agent.runners._ray._ray_runner import RayRunner

        return RayRunner
    if name == "RayJob":
        from zett_agent.runners._ray._ray_job import RayJob

        return RayJob
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
