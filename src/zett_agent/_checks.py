"""Argument checks shared by every public constructor: one rule, one wording.

The rule: a value of the wrong type raises ``TypeError``, a value of the right type outside
what is accepted raises ``ValueError``. Both messages read ``{where} must be {what}, got
{value}``, where ``where`` names the argument as the caller wrote it
(``ProcessPool(max_workers=...)``), so the message says where to look and what to write.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "check_choice",
    "check_env",
    "check_flag",
    "check_int",
    "check_names",
    "check_number",
    "check_seconds",
    "described",
    "repeated_names",
]


def described(value: object) -> str:
    """``value`` for an error message: its type and a short repr (a hostile repr is cut)."""
    return f"{type(value).__name__} {value!r:.40}"


def _bounds(low: float, high: float | None) -> str:
    return f"at least {low:g}" if high is None else f"at least {low:g} and at most {high:g}"


def check_int(where: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``.

    Raises:
        TypeError: If ``value`` is not an int.
        ValueError: If it is outside ``[low, high]``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} must be an int, got {described(value)}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{where} must be {_bounds(low, high)}, got {value}")
    return value


def check_number(
    where: str,
    value: object,
    *,
    low: float = 0.0,
    high: float | None = None,
    above: bool = False,
    unit: str = "",
) -> float:
    """``value`` as a float if it is a finite number in range.

    In range: at least ``low`` (greater than ``low`` when ``above``) and, when ``high`` is
    given, below it. ``unit`` names what the number counts, for the message.

    Raises:
        TypeError: If ``value`` is not an int or a float (a bool is refused).
        ValueError: If it is not finite or out of range.
    """
    what = f"a number of {unit}" if unit else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{where} must be {what}, got {described(value)}")
    number = float(value)
    if (
        not math.isfinite(number)
        or number < low
        or (above and number == low)
        or (high is not None and number >= high)
    ):
        first = f"greater than {low:g}" if above else f"at least {low:g}"
        upper = "" if high is None else f" and below {high:g}"
        raise ValueError(f"{where} must be {what} {first}{upper}, got {value!r:.40}")
    return number


def check_seconds(
    where: str, value: object, *, low: float = 0.0, high: float | None = None, above: bool = False
) -> float:
    """:func:`check_number` for a duration: ``{where} must be a number of seconds ...``."""
    return check_number(where, value, low=low, high=high, above=above, unit="seconds")


def check_flag(where: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False``.

    Raises:
        TypeError: If it is anything else (``1`` and ``"yes"`` included).
    """
    if not isinstance(value, bool):
        raise TypeError(f"{where} must be True or False, got {described(value)}")
    return value


def check_choice(where: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``.

    Raises:
        TypeError: If it is not a str.
        ValueError: If it is a str that is not one of them.
    """
    if not isinstance(value, str):
        raise TypeError(f"{where} must be one of {', '.join(choices)}, got {described(value)}")
    if value not in choices:
        raise ValueError(f"{where} must be one of {', '.join(choices)}, got {value!r:.40}")
    return value


def check_names(where: str, value: object, what: str = "names") -> tuple[str, ...]:
    """``value`` as a tuple if it is a sequence of str.

    A lone str is refused: it is a sequence of its letters, never what the caller meant.

    Raises:
        TypeError: If it is a str, not a sequence, or holds something other than a str.
    """
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{where} must be a list of {what} (str), got {described(value)}")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{where} must be a list of {what} (str), got {described(name)} in it")
    return names


def check_env(where: str, env: object) -> Mapping[str, str]:
    """``env`` if it is a mapping of environment variable names to values (both str).

    Raises:
        TypeError: If it is not a mapping, or maps something other than a str to a str.
        ValueError: If a name is empty or holds ``=`` or a NUL, or a value holds a NUL.
    """
    if not isinstance(env, Mapping):
        raise TypeError(
            f"{where} must be a mapping of str to str or None, got {type(env).__name__}"
        )
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"{where} must map str to str; {key!r:.40}: {value!r:.40} is not")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"{where} has an invalid variable name or value: {key!r:.40}")
    return env


def repeated_names(names: Iterable[str]) -> list[str]:
    """The names that stand more than once in ``names``, sorted (empty if none does)."""
    names = list(names)
    return sorted({name for name in names if names.count(name) > 1})
