"""Fixtures for the model adapter tests."""

from __future__ import annotations

import asyncio

import pytest
import uvloop


@pytest.fixture(autouse=True)
def _no_proxy_or_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback requests must not go through a proxy, and no real key may leak into a test."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="session")
def uvloop_ready() -> None:
    """Let libuv create its process-wide signal pipe before a test's fd snapshot is taken.

    The first uvloop loop of a process opens a pipe that lives as long as the process; that is
    libuv's global state, not a leak of the test that happens to run first.
    """
    uvloop.run(asyncio.sleep(0))
