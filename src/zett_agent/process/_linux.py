"""The few Linux process controls the engine needs (``prctl``), through ctypes.

Imported by the launcher and the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["set_child_subreaper", "set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


def _call(option: int, value: int) -> None:
    if _prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}) failed")


def set_child_subreaper(enabled: bool = True) -> None:
    """Make orphaned descendants of this process reparent to it instead of to PID 1."""
    _call(_PR_SET_CHILD_SUBREAPER, int(enabled))


def set_parent_death_signal(signum: int) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent thread dies."""
    _call(_PR_SET_PDEATHSIG, signum)
