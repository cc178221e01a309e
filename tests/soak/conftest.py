"""Options of the soak test: ``--soak-size N`` (children in total) and ``--soak-seed S``.

They exist when pytest is given this directory (``uv run pytest -m soak --soak-size 2000 -s
tests/soak``); a plain ``uv run pytest`` runs the short soak with the defaults.
"""

from __future__ import annotations

import pytest

#: children in the default (short) soak that ``uv run pytest`` runs
DEFAULT_SIZE = 60


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("soak")
    group.addoption(
        "--soak-size",
        type=int,
        default=DEFAULT_SIZE,
        help=f"children the soak test starts in total (default {DEFAULT_SIZE})",
    )
    group.addoption(
        "--soak-seed",
        type=int,
        default=None,
        help="seed of the soak's random mix (default: a fresh one, printed)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a long soak needs more than the suite's per-test timeout; about 0.2 s per child is
    # ample on 2 cores, and the timeout stays a hang guard
    size = int(config.getoption("--soak-size"))
    for item in items:
        if item.get_closest_marker("soak"):
            item.add_marker(pytest.mark.timeout(max(120, int(size * 0.5))))
