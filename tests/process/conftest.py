"""Fixtures of the process engine tests: every async test runs under asyncio and uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import cloudpickle
import pytest
import uvloop

from . import _jobs

# job functions travel by value, so a fresh worker never has to import the test package
cloudpickle.register_pickle_by_value(_jobs)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session", autouse=True)
def _uvloop_ready() -> None:
    """Let libuv open its process-wide signal pipe before any test's fd snapshot is taken."""
    uvloop.run(asyncio.sleep(0))
