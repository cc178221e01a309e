"""What a Ray child ended with when its task never reported its end.

What a Ray child ended with when its task never reported its end: a pure function of Ray's error and
what the driver knows, tested with made-up Ray errors.

The child itself never runs in the Ray worker (it runs in a process of the node's pool, whose
errors arrive in the ``end`` record), so an error from Ray here is about the Ray worker, its
node or the cluster, or a stop this runner asked for.
"""

from __future__ import annotations

import ray.exceptions as rex

from zett_agent.process import (
    JobCancelled,
    JobFailed,
    LimitExceeded,
    PoolClosed,
    ProcessLimits,
    WorkerCrashed,
)
from zett_agent.runners._ray._ray_errors import NodeLost, first_line

__all__ = ["needs_liveness", "outcome"]

#: Ray's errors that say the node is gone, without asking the cluster
_NODE_GONE = (rex.NodeDiedError, rex.LocalRayletDiedError)
_NO_LIVENESS = (rex.TaskCancelledError, *_NODE_GONE)


def needs_liveness(error: BaseException | None, killed: bool) -> bool:
    """Whether ``outcome`` needs to know if the node still lives.

    Whether ``outcome`` needs to know if the node still lives (the caller asks the cluster and
    passes ``node_alive``): not for a stop this runner asked for or one from outside
    (``TaskCancelledError``), nor when Ray said the node died.
    """
    return not killed and not isinstance(error, _NO_LIVENESS)


def outcome(
    error: BaseException | None,
    *,
    killed: BaseException | None,
    node_alive: bool,
    closed: bool,
    node_id: str | None,
    limits: ProcessLimits,
    peak: int = 0,
) -> BaseException:
    """The error a child's job ends with when its stream ended without an ``end`` record.

    Args:
        error: What Ray raised from the stream (``None``: it ended without an error, which
            the task does only once it killed the child after a cancel).
        killed: The reason this runner stopped the job with (cancel, timeout, close,
            protocol), if it did: that reason wins.
        node_alive: Whether the node still answers (see ``needs_liveness``).
        closed: Whether the runner was closed meanwhile.
        node_id: The node's id, for ``NodeLost``.
        limits: The job's limits (a memory limit turns Ray's memory monitor into
            ``LimitExceeded``).
        peak: The child's peak resident memory seen so far.
    """
    if killed is not None:
        return killed
    if error is None or isinstance(error, rex.TaskCancelledError):
        return JobCancelled("the Ray task was cancelled outside zett_agent")
    if isinstance(error, _NODE_GONE) or not node_alive:
        return NodeLost(node_id, first_line(error))
    if isinstance(error, rex.OutOfMemoryError):
        if limits.memory_bytes is not None:
            return LimitExceeded("memory_bytes", limits.memory_bytes, peak or None)
        return WorkerCrashed(None, None, f"Ray's memory monitor ended it: {first_line(error)}")
    if isinstance(error, rex.WorkerCrashedError):
        return WorkerCrashed(None, None, f"the Ray worker that ran it died ({first_line(error)})")
    if isinstance(error, rex.RayTaskError):
        # the task failed in Ray before the child ran (an argument that cannot be loaded in the
        # Ray worker: a brokered model whose class is missing on the node, for example)
        cause = error.cause if isinstance(error.cause, BaseException) else error
        return JobFailed(type(cause).__name__, first_line(cause), str(error)[-20000:])
    if closed:
        return PoolClosed("the RayRunner was closed before the child finished")
    return NodeLost(node_id, f"{type(error).__name__}: {first_line(error)}")
