"""Run every async foundation test under both the stdlib event loop and uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


@pytest.fixture(scope="session", autouse=True)
def _uvloop_ready() -> None:
    """Let libuv open its process-wide signal pipe before any test's fd snapshot is taken."""
    uvloop.run(asyncio.sleep(0))


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
