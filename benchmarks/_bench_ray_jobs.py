"""Job functions of bench_ray.py, importable by name in Ray workers and engine workers."""

from __future__ import annotations

import hashlib
import os
import time


def stamp(emit_name: str) -> float:
    """Report the moment the child runs (CLOCK_MONOTONIC is one clock for the machine)."""
    now = time.monotonic()
    _emit(emit_name, {"running": now, "pid": os.getpid()})
    return now


def spin(emit_name: str) -> None:
    _emit(emit_name, {"pid": os.getpid()})
    while True:
        pass


def hash_rounds(rounds: int) -> str:
    digest = b"zett"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def _emit(name: str, event: dict[str, float | int]) -> None:
    if name == "ray":
        from zett_agent.runners.ray import emit
    else:
        from zett_agent.process import emit
    emit(event)
