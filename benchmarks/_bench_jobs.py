"""Job functions of ``bench_process.py``, importable so every pool sends them by reference."""

from __future__ import annotations

import os
from typing import Any

from zett_agent.process import emit


def noop(*_: Any) -> None:
    return None


def spin_report(path: str) -> None:
    """Publish this process's pid in ``path``, then burn CPU forever."""
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as stream:
        stream.write(str(os.getpid()))
    os.rename(tmp, path)
    while True:
        pass


def burn(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def big_result(n: int) -> str:
    return "x" * n


def streamer(n: int) -> int:
    for i in range(n):
        emit({"i": i})
    return n


def spin_emit() -> None:
    emit(os.getpid())
    while True:
        pass


def wait_forever() -> None:
    """A child waiting on I/O, as a child agent waiting on its model does."""
    import time

    emit("up")
    time.sleep(3600)


def amplify(items: int) -> Any:
    """About 3 bytes of JSON per item that decode into about 70 bytes each: ``[{}, {}, ...]``."""
    return [{}] * items


def emit_amplified(items: int, count: int) -> str:
    for _ in range(count):
        emit([{}] * items)
    return "emitted"


def spin_with_sleepers() -> None:
    """Spin with two ``sleep`` grandchildren; emit every pid first (the worker's, then theirs)."""
    import subprocess

    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    emit([os.getpid(), *(child.pid for child in sleepers)])
    while True:
        pass
