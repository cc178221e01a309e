"""Per-test timeout of the soak, scaled to ``--soak-size`` (options live in tests/conftest.py)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a long soak needs more than the suite's per-test timeout; about 0.2 s per child is
    # ample on 2 cores, and the timeout stays a hang guard
    size = int(config.getoption("--soak-size"))
    for item in items:
        if item.get_closest_marker("soak"):
            item.add_marker(pytest.mark.timeout(max(120, int(size * 0.5))))
