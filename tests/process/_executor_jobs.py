"""Jobs of the Executor's tests: values the standard library returns as they are, and helpers
that run in the workers (importable, so they travel by reference)."""

from __future__ import annotations

import dataclasses
import fractions
import os
from multiprocessing import current_process
from typing import Any

#: what the initializer of the last executor set in this worker
STATE = "uninitialized"


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


class Custom:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is Custom and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


class CustomError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


def values() -> dict[Any, Any]:
    """What JSON would change or refuse, and pickle carries unchanged."""
    return {
        1: (1, 2),
        "set": {1, 2, 3},
        "frozenset": frozenset({"a"}),
        b"bytes": bytearray(b"\x00\xff"),
        "fraction": fractions.Fraction(1, 3),
        "point": Point(1, 2),
        "custom": Custom([1, {2: 3}]),
        (1, "tuple key"): None,
    }


def divide(x: int, y: int) -> float:
    return x / y  # the line the remote traceback shows


def raise_custom(code: int) -> None:
    raise CustomError(code, "it went wrong")


def raise_system_exit(code: int) -> None:
    raise SystemExit(code)


def init(value: str) -> None:
    global STATE
    STATE = value


def init_fail() -> None:
    raise ValueError("error in initializer")


def state() -> str:
    return STATE


def pid() -> int:
    return os.getpid()


def authkey() -> bytes:
    return bytes(current_process().authkey)


def put(queue: Any, value: Any) -> None:
    queue.put(value)


def big(size: int) -> bytes:
    return os.urandom(size)


class ExitAtUnpickle:
    """A value whose unpickling raises ``SystemExit`` (in whichever process unpickles it)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _exit, ()


def _exit() -> None:
    raise SystemExit(7)


def exit_at_unpickle() -> ExitAtUnpickle:
    return ExitAtUnpickle()


class ErrorAtPickle:
    def __reduce__(self) -> tuple[Any, ...]:
        from pickle import PicklingError

        raise PicklingError("refused by __reduce__")
