"""Every exception zett_agent raises to its callers, in one place.

Each name here is the same class as in its home module (``zett_agent.process.WorkerCrashed``
is ``zett_agent.errors.WorkerCrashed``), imported on first access, so ``import
zett_agent.errors`` stays cheap. The tree::

    ProcessError                 a job or a pool of the process engine (zett_agent.process)
    ├── JobFailed                the job's function raised in the child
    ├── WorkerCrashed            the child process died before it sent a result
    ├── JobTimeout               the job ran past its timeout; its tree was killed
    ├── LimitExceeded            the job went over one of its ProcessLimits
    ├── ProtocolError            the child sent what the protocol does not allow
    ├── PoolClosed               the pool was closed before or while the job ran
    ├── JobCancelled             the job was cancelled (its tree was killed)
    ├── SandboxUnavailable       the kernel cannot apply a required Sandbox
    └── NodeLost                 the Ray node running the child went away (zett_agent.runners.ray)
    AgentError                   a request broke the runtime's own rules (zett_agent.agent)
    ├── MaxTurnsExceeded         the request used max_turns turns without a final answer
    ├── AgentClosedError         the agent was closed
    └── ModelStreamError         the model's stream ended without its completed event
    ModelError                   a model call failed (zett_agent.model)
    ├── TransientModelError      a failure worth retrying: rate limit, server error, dropped link
    └── ScriptExhaustedError     an offline model ran out of its script (zett_agent.testing)
    ToolArgumentError            a tool was called with bad arguments (a ValueError)
    UnknownToolError             the model called a tool that does not exist (a LookupError)
    TaskStoreError               a task store is held by a live host, damaged or newer

Catch a root to catch its domain: ``ProcessError`` for anything a job or a pool can end with,
``AgentError`` for the runtime's rules, ``ModelError`` for the provider. A bad argument to a
constructor or a call is a plain ``TypeError`` (a wrong type) or ``ValueError`` (a bad value),
whose message names the argument, what it got and what it takes. ``asyncio.CancelledError`` is
never wrapped.

Naming rule: a root is ``<Domain>Error``. Below a root, an exception that reports how a job or
a request ended is named by that outcome (``WorkerCrashed``, ``JobTimeout``, ``PoolClosed``,
``MaxTurnsExceeded``: the names the contract fixes); every other exception ends in ``Error``.
An exception that is also one of Python's kinds subclasses it (``ToolArgumentError`` is a
``ValueError``), so code written for the builtin kind keeps working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zett_agent._lazy import lazy_names

if TYPE_CHECKING:
    from zett_agent.agent import AgentClosedError, AgentError, MaxTurnsExceeded, ModelStreamError
    from zett_agent.extensions.async_subagent import TaskStoreError
    from zett_agent.model import ModelError, TransientModelError
    from zett_agent.process import (
        JobCancelled,
        JobFailed,
        JobTimeout,
        LimitExceeded,
        PoolClosed,
        ProcessError,
        ProtocolError,
        SandboxUnavailable,
        WorkerCrashed,
    )
    from zett_agent.runners.ray import NodeLost
    from zett_agent.testing import ScriptExhaustedError
    from zett_agent.tools import ToolArgumentError, UnknownToolError

#: each name and the public module it lives in
_HOMES = {
    "ProcessError": "zett_agent.process",
    "JobFailed": "zett_agent.process",
    "WorkerCrashed": "zett_agent.process",
    "JobTimeout": "zett_agent.process",
    "LimitExceeded": "zett_agent.process",
    "ProtocolError": "zett_agent.process",
    "PoolClosed": "zett_agent.process",
    "JobCancelled": "zett_agent.process",
    "SandboxUnavailable": "zett_agent.process",
    "NodeLost": "zett_agent.runners.ray",
    "AgentError": "zett_agent.agent",
    "MaxTurnsExceeded": "zett_agent.agent",
    "AgentClosedError": "zett_agent.agent",
    "ModelStreamError": "zett_agent.agent",
    "ModelError": "zett_agent.model",
    "TransientModelError": "zett_agent.model",
    "ScriptExhaustedError": "zett_agent.testing",
    "ToolArgumentError": "zett_agent.tools",
    "UnknownToolError": "zett_agent.tools",
    "TaskStoreError": "zett_agent.extensions.async_subagent",
}

__all__ = [
    "AgentClosedError",
    "AgentError",
    "JobCancelled",
    "JobFailed",
    "JobTimeout",
    "LimitExceeded",
    "MaxTurnsExceeded",
    "ModelError",
    "ModelStreamError",
    "NodeLost",
    "PoolClosed",
    "ProcessError",
    "ProtocolError",
    "SandboxUnavailable",
    "ScriptExhaustedError",
    "TaskStoreError",
    "ToolArgumentError",
    "TransientModelError",
    "UnknownToolError",
    "WorkerCrashed",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
