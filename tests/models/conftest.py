"""Fixtures for the model adapter tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_proxy_or_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback requests must not go through a proxy, and no real key may leak into a test."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
