"""The Ray tests: skipped, saying why, without the ray extra; every test here runs under the
Ray leak guard (``support.ray_cluster``, which also holds the session's ``ray_cluster``
fixture that tests/conftest.py offers the whole suite).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.ray_cluster import NO_RAY, ray_leak_guard

pytest.importorskip("ray", reason=NO_RAY)


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite's leak guard, plus the cluster's leftovers; Ray's own sockets are exempt."""
    yield from ray_leak_guard(request)
