"""What a child tells its parent: one line per failure, and the report's text.

Both are valid Unicode whatever the runner delivered (a lone surrogate becomes U+FFFD): they
go into the parent's messages and tool results, which a model request must encode as UTF-8.
``died`` tells a child whose process died from one that failed or was stopped.
"""

from __future__ import annotations

from typing import Any

from zett_agent import process
from zett_agent._text import valid_text

#: longest failure reason shown to the model
MAX_REASON = 500


def failure_reason(error: BaseException) -> str:
    """One line the parent model can act on, for a child that did not complete.

    Keeps the cause: a crash whose ``__cause__`` explains it (the pool's launcher died, for
    example) names that cause instead of an exit status nobody can act on.
    """
    match error:
        case process.JobFailed():
            text = f"the child agent raised {error.type_name}: {error.message}"
        case process.WorkerCrashed():
            why = getattr(error, "reason", None)  # set by engines that know why it was lost
            if error.signal_name:
                text = f"the child process was killed by {error.signal_name}"
            elif error.exitcode is not None:
                text = f"the child process exited with code {error.exitcode} before reporting"
            elif why:
                text = f"the child process was lost before reporting: {why}"
            else:
                text = "the child process was lost before reporting (its exit status is unknown)"
            if error.__cause__ is not None and not why:
                text += f": {_cause(error.__cause__)}"
        case process.JobTimeout():
            text = f"the child ran out of time (timeout={error.timeout:g}s)"
        case process.LimitExceeded():
            text = _limit(error)
        case process.ProtocolError():
            text = f"the child sent invalid data and was killed: {error.reason}"
        case process.PoolClosed():
            text = "the extension was closed before the child finished"
        case process.JobCancelled():
            text = "cancelled"
        case process.ProcessError():
            text = str(error)
            if error.__cause__ is not None:
                text += f": {_cause(error.__cause__)}"
        case _:
            text = f"{type(error).__name__}: {error}"
    return _one_line(text)


def died(error: BaseException | None) -> bool:
    """Whether the child's process died under it, rather than failing or being stopped.

    A crash or a signal from outside (``WorkerCrashed``), its memory limit, or its Ray node
    lost: what a durable task resumes from. Its own exception, a cancel, a timeout, the CPU
    limit and invalid data are not deaths.
    """
    from zett_agent.runners._ray._ray_errors import NodeLost

    if isinstance(error, process.LimitExceeded):
        return "memory" in error.limit
    return isinstance(error, (process.WorkerCrashed, NodeLost))


def _cause(cause: BaseException) -> str:
    text = str(cause) or type(cause).__name__
    return text if isinstance(cause, process.ProcessError) else f"{type(cause).__name__}: {text}"


def _limit(error: process.LimitExceeded) -> str:
    if error.limit == "memory_bytes":
        reached = f"; peak resident memory {_bytes(error.reached)}" if error.reached else ""
        return (
            f"the child hit its memory_bytes limit of {_bytes(error.value)} (address space, "
            f"which counts more than resident memory{reached})"
        )
    if error.limit == "cpu_seconds":
        used = f", used {error.reached:g} s" if error.reached is not None else ""
        return f"the child hit its cpu_seconds limit of {error.value:g} s of CPU time{used}"
    return f"the child hit its {error.limit} limit ({error.value:g})"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:g} bytes"


def _one_line(text: str) -> str:
    text = " ".join(valid_text(text).split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def report_content(result: Any) -> str:
    """The text of a child's report (``run_child`` returns ``{"content": ...}``)."""
    if isinstance(result, dict) and isinstance(result.get("content"), str):
        return valid_text(str(result["content"]))
    return valid_text(str(result))
