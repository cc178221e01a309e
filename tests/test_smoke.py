from __future__ import annotations

import zett_agent


def test_package_has_a_version() -> None:
    assert zett_agent.__version__
