"""The process engine's containment strategies, the one list every containment-parametrized
test (the ``containment`` fixture of tests/conftest.py, the Ray runner fixtures) runs over.

A strategy the machine cannot offer is skipped, saying why: ``problem(kind)``.
"""

from __future__ import annotations

from zett_agent.process._containment._cgroup import cgroup_problem

#: each containment strategy of the engine
CONTAINMENTS = ("cgroup", "scan")

_NO_CGROUP = cgroup_problem()


def problem(kind: str) -> str | None:
    """Why this machine cannot contain with ``kind`` (``None`` when it can)."""
    if kind == "cgroup" and _NO_CGROUP is not None:
        return f"no cgroup containment on this machine: {_NO_CGROUP}"
    return None
