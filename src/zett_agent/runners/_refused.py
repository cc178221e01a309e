"""A child that never started: the ``ChildJob`` of a runner that refused it.

A runner that cannot enforce what a child asks for (a required ``Sandbox``, on a runner that
does not enforce sandboxes) still hands the extension a job, so the task exists, fails with the
reason, and the parent model reads why, like any other failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from zett_agent.process import JobUsage

__all__ = ["RefusedJob", "unenforced"]


def unenforced(reason: str, *, refused: bool) -> dict[str, Any]:
    """The ``sandbox`` entry of a task whose runner enforces nothing of its sandbox."""
    entry: dict[str, Any] = {"enforced": False, "reason": reason}
    if refused:
        entry["refused"] = reason
    return entry


class RefusedJob:
    """A job that ended before it began, with ``error`` as its outcome."""

    pid: int | None = None

    def __init__(self, error: BaseException, info: Mapping[str, Any]) -> None:
        self._error = error
        self._info = dict(info)

    def __repr__(self) -> str:
        return f"<RefusedJob {self._error!r}>"

    async def events(self) -> AsyncIterator[Any]:
        return
        yield  # an async generator that yields nothing

    def done(self) -> bool:
        return True

    async def wait(self) -> None:
        return None

    def result(self) -> Any:
        raise self._error

    def exception(self) -> BaseException | None:
        return self._error

    async def cancel(self) -> None:
        return None

    def usage(self) -> JobUsage:
        return JobUsage(0.0, 0, 0, 0.0)

    def info(self) -> Mapping[str, Any]:
        return self._info
