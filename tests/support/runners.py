"""The child runners that runner-parametrized tests run under: one line each in ``RUNNERS``.

A test takes the ``runner`` fixture its module defines with ``runner_params(...)`` (a kind)
and makes the runner with ``make_runner(kind)``. A runner that needs more than this process
says so with marks: ``ray`` tests get the session's Ray cluster and Ray's leak guard
(tests/conftest.py), run after every other test, and are skipped, saying why, without the ray
extra. A test that cannot hold for a runner skips it, naming why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from zett_agent.runners import ChildRunner, InProcessRunner, ProcessRunner


def _ray_runner() -> ChildRunner:
    from zett_agent.runners.ray import RayRunner  # the ray extra: only where a test runs it

    return RayRunner()


@dataclass(frozen=True)
class RunnerKind:
    """How to make one kind of runner, and the marks its tests carry."""

    make: Callable[[], ChildRunner]
    marks: Sequence[pytest.MarkDecorator] = ()


RUNNERS: dict[str, RunnerKind] = {
    "process": RunnerKind(ProcessRunner),
    "in-process": RunnerKind(InProcessRunner),
    "ray": RunnerKind(_ray_runner, marks=(pytest.mark.ray,)),
}


def runner_params(*kinds: str) -> list[object]:
    """Fixture params of the runner ``kinds`` (all of ``RUNNERS`` when none is named)."""
    return [pytest.param(kind, marks=RUNNERS[kind].marks) for kind in kinds or RUNNERS]


def make_runner(kind: str) -> ChildRunner:
    """A fresh runner of ``kind``."""
    return RUNNERS[kind].make()
