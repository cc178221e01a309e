"""The runner interface: how a subagent extension starts, watches and stops its children."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

if TYPE_CHECKING:
    from zett_agent.process import JobUsage, ProcessLimits, Sandbox
    from zett_agent.runners._child import ChildSpec

__all__ = [
    "ChildJob",
    "ChildRunner",
    "CountsTokens",
    "JobOutcome",
    "SupportsSend",
    "WrappedJob",
    "counts_tokens",
]


@runtime_checkable
class ChildJob(Protocol):
    """One running child, as a runner hands it to the extension.

    The outcome is the child's report (``result()``) or one exception (``exception()``):
    the process engine's errors are the vocabulary (``JobFailed`` for an exception the child
    raised, ``WorkerCrashed``, ``JobTimeout``, ``LimitExceeded``, ``JobCancelled`` after
    ``cancel()``, ``PoolClosed`` when the runner closed under it); a runner with other
    failure modes raises its own ``zett_agent.process.ProcessError`` subclass.
    """

    @property
    def pid(self) -> int | None:
        """The id of the OS process the child runs in.

        The id of the OS process the child runs in while it runs (``None`` before, after,
        and where a runner has no such thing).
        """
        ...

    def events(self) -> AsyncIterator[Any]:
        """The child's progress events (JSON-compatible dicts), in order, until it ends.

        Iterated once, by one consumer. A job may drop events nobody reads.
        """
        ...

    def done(self) -> bool:
        """Whether the child reached its outcome."""
        ...

    async def wait(self) -> None:
        """Wait for the outcome without raising it. Cancelling the caller leaves the child."""
        ...

    def result(self) -> Any:
        """The child's report (``run_child``'s return value); raises its exception instead."""
        ...

    def exception(self) -> BaseException | None:
        """The child's exception, or ``None`` when it completed. Only once ``done()``."""
        ...

    async def cancel(self) -> None:
        """Stop the child and return once it is gone (for processes: the whole tree reaped).

        A finished child is left as it is. If the caller is cancelled meanwhile, the stop still
        completes.
        """
        ...

    def usage(self) -> JobUsage:
        """CPU seconds, resident memory and its peak, and elapsed time of the child so far."""
        ...

    def info(self) -> Mapping[str, Any]:
        """Runner-specific facts for ``task_info`` (JSON-compatible).

        Why a child still waits, which node runs it... Keys here are added to the task's info, while
        it runs and after it ended (return only what still holds then: the node it ran on, not why
        it waits); an empty mapping adds nothing.
        """
        ...


class JobOutcome(Protocol):
    """What a wrapped job answers for its wrapper: its process, its outcome and its usage."""

    @property
    def pid(self) -> int | None: ...

    def done(self) -> bool: ...

    async def wait(self) -> None: ...

    def result(self) -> Any: ...

    def exception(self) -> BaseException | None: ...

    def usage(self) -> JobUsage: ...


class WrappedJob:
    """A job that answers for the one it wraps (``job``): the same pid, outcome and usage.

    The base of the runners' own job classes, which change only how events, cancel or info
    go; each sets ``job`` in its ``__init__``.
    """

    __slots__ = ()
    job: JobOutcome

    @property
    def pid(self) -> int | None:
        return self.job.pid

    def done(self) -> bool:
        return self.job.done()

    async def wait(self) -> None:
        await self.job.wait()

    def result(self) -> Any:
        return self.job.result()

    def exception(self) -> BaseException | None:
        return self.job.exception()

    def usage(self) -> JobUsage:
        return self.job.usage()


@runtime_checkable
class SupportsSend(Protocol):
    """A ``ChildJob`` that delivers messages to its running child (optional capability).

    ``AsyncSubAgentExtension`` sends ``task_message`` (and ``extension.send``) through it; a job
    without ``send`` makes the extension refuse messages to its children with an error that
    names the runner. What the runner must do:

    - in the parent, ``send(message)`` hands ``message`` (a JSON-compatible dict the extension
      built: ``{"id": str, "text": str, "interrupt": bool}``) to the child, in order;
    - where the child runs, pass ``run_child(spec, emit, receive)`` a ``receive`` coroutine
      function that returns the next message, in the order sent (and raises ``EOFError``
      once no more can come).

    ``run_child`` does the rest (``zett_agent.runners._child_inbox``): it delivers each
    message to the child's agent before its next model call, or steers its running request,
    and confirms it with a ``{"kind": "message_delivered", "id": ...}`` event through ``emit``
    (so through ``events()``). The extension counts a message delivered only on that event.
    """

    async def send(self, message: Mapping[str, Any]) -> None:
        """Hand ``message`` to the running child; return once it is on its way.

        That is, queued for the child, not read by it.

        May be called before the child started (the message waits for it) or only once it
        runs, as the runner documents; the extension sends only after the child's first
        event. Messages sent to a child that ends are discarded.

        Raises:
            RuntimeError: the child is not running (it ended or is being stopped); the
                message was not sent.

        Cancellation: a message whose ``send`` is cancelled may or may not have been sent.
        """
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """A ``ChildJob`` whose runner counts the child's model tokens itself (optional).

    For a child whose model calls the parent makes (brokered calls, ``_broker``), the parent
    knows their usage, where otherwise only the child's own reports (``turn_finished``
    events) say it. The extension's token budgets use these counts instead of the child's
    reports when a job has them.
    """

    def tokens(self) -> tuple[int, int] | None:
        """``(input_tokens, output_tokens)`` of the calls the runner made for the child.

        ``None`` when it makes none (the child's reports are all there is).
        """
        ...

    def on_tokens(self, callback: Callable[[int], bool]) -> None:
        """Call ``callback(more)`` on the event loop: ``tokens()`` changed, or a call comes.

        ``more`` is ``0`` when ``tokens()`` changed, and the estimated input tokens of a model
        call the runner is about to make for the child (before it makes it). ``False`` means
        the child is being stopped (a budget): the runner makes no call for it from then on,
        and closes those under way (each still charged).
        """
        ...


#: job classes known to be ``CountsTokens`` or not (``counts_tokens``)
_COUNTING: dict[type, bool] = {}


def counts_tokens(job: object) -> TypeGuard[CountsTokens]:
    """Whether ``job`` is a ``CountsTokens``, decided once for its class (its methods say).

    The extension asks at every usage report of a child; on Python 3.11 the check of a runtime
    protocol walks the protocol's members again at each call (tens of microseconds, about 4%
    of the parent's loop while 1,000 brokered children started).
    """
    kind = type(job)
    known = _COUNTING.get(kind)
    if known is None:
        known = _COUNTING[kind] = isinstance(job, CountsTokens)
    return known


@runtime_checkable
class ChildRunner(Protocol):
    """Starts children for a subagent extension; chosen with ``runner=`` on the extension.

    Three exist: ``ProcessRunner`` (the default: a process per child, hard kill, limits),
    ``InProcessRunner`` (asyncio tasks in the parent, for development without the process
    engine) and, as an optional extra, a Ray runner. A runner belongs to one extension, which
    closes it in its own ``close()``.

    The contract for every runner, tested against each (``tests/subagents``): ``submit``
    never waits for the child to finish; the job reaches exactly one outcome; ``cancel``
    returns once the child is gone; ``close`` leaves nothing running.
    """

    def warm_up(self, modules: Iterable[str] = ()) -> None:
        """Prepare in the background so the first child starts fast; never blocks.

        Called from the event loop at the start of every request of an agent that may start
        children, and before each ``submit``. ``modules`` are the importable modules the coming
        children will import (their tools, models and extensions; never ``__main__``): a runner
        may import them ahead (``ProcessRunner`` preloads them in its launcher) or ignore them.
        """
        ...

    async def submit(
        self,
        spec: ChildSpec,
        *,
        limits: ProcessLimits | None = None,
        sandbox: Sandbox | None = None,
    ) -> ChildJob:
        """Start one child running ``run_child(spec)`` and return its job at once.

        ``limits`` bound it (a runner documents which fields it honours). ``sandbox`` (passed
        only when the definition or the extension sets one: a runner written before sandboxes
        still works for the others) confines it; a runner that cannot enforce a required one
        returns a job that failed with ``SandboxUnavailable``, and says in the job's ``info()``
        (``"sandbox"``) what it enforced. Awaits only the runner's own start (a pool booting),
        never the child.

        Raises:
            TypeError: the spec cannot be shipped to where the child runs; the message names
                the part (``unpicklable_part``).
            RuntimeError: the runner is closed.
        """
        ...

    async def close(self) -> None:
        """Release what the runner holds (its pool, its connection). Idempotent.

        The extension cancels its running children before calling this; a runner still kills
        whatever is left, so nothing outlives the call.
        """
        ...
