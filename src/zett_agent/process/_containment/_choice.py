"""Which containment a pool gets: cgroup v2 where it works here, else ``/proc`` scans."""

from __future__ import annotations

from . import _cgroup
from ._cgroup_containment import CgroupContainment
from ._scan_containment import ScanContainment
from ._strategy import Containment

__all__ = ["create"]


def create(mode: str) -> Containment:
    """The strategy for ``mode``.

    ``"cgroup"``, ``"scan"``, or ``"auto"`` (cgroup where it works here, else scan). Raises
    ``ValueError`` for another mode and ``OSError`` when ``"cgroup"`` is not available (the message
    says why).
    """
    if mode == "scan":
        return ScanContainment()
    if mode not in ("cgroup", "auto"):
        raise ValueError(f"containment must be 'auto', 'cgroup' or 'scan', got {mode!r:.40}")
    problem = _cgroup.cgroup_problem()
    if problem is None:
        return CgroupContainment()
    if mode == "auto":
        return ScanContainment()
    raise OSError(f"containment='cgroup' is not available here: {problem}")
