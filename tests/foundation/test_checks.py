"""One rule for constructor arguments: the same mistake gets the same exception type and the
same wording from every class that takes the argument."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from zett_agent.process import ProcessPool
from zett_agent.runners import ProcessRunner


def ray_runner(**options: Any) -> Any:
    # imported when a test runs, never while the suite is collected (see tests/conftest.py)
    from zett_agent.runners.ray import RayRunner

    return RayRunner(**options)


MAKERS: dict[str, Callable[..., Any]] = {"ProcessPool": ProcessPool, "ProcessRunner": ProcessRunner}
if importlib.util.find_spec("ray") is not None:
    MAKERS["RayRunner"] = ray_runner

#: an argument each of these classes takes, by class
COUNTS = {"ProcessPool": "max_workers", "ProcessRunner": "max_children", "RayRunner": "max_retries"}
DURATIONS = {"ProcessPool": "kill_grace", "ProcessRunner": "kill_grace", "RayRunner": "end_timeout"}


#: (the argument of each class, a mistake, the exception it raises, what its message says)
MISTAKES = [
    (COUNTS, 2.5, TypeError, "must be an int, got float 2.5"),
    (COUNTS, True, TypeError, "must be an int, got bool True"),
    (COUNTS, "3", TypeError, "must be an int, got str '3'"),
    (COUNTS, -5, ValueError, "must be at least"),
    (DURATIONS, "1", TypeError, "must be a number of seconds, got str '1'"),
    (DURATIONS, False, TypeError, "must be a number of seconds, got bool False"),
    (DURATIONS, float("nan"), ValueError, "must be a number of seconds"),
    (DURATIONS, -1, ValueError, "must be a number of seconds"),
]


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize(("names", "value", "error", "says"), MISTAKES)
def test_a_count_or_a_duration_of_the_wrong_type_or_value_is_refused_alike(
    maker: str, names: dict[str, str], value: object, error: type[Exception], says: str
) -> None:
    name = names[maker]
    with pytest.raises(error) as refused:
        MAKERS[maker](**{name: value})
    assert str(refused.value).startswith(f"{maker}({name}=...) {says}"), refused.value


@pytest.mark.parametrize("maker", ["ProcessPool", "ProcessRunner"])
def test_a_lone_str_for_a_list_of_modules_is_a_type_error(maker: str) -> None:
    with pytest.raises(TypeError, match=r"\(preload=...\) must be a list of module names \(str\)"):
        MAKERS[maker](preload="json")


@pytest.mark.parametrize("maker", sorted(set(MAKERS) - {"ProcessRunner"}))  # it has no such option
def test_an_unknown_containment_is_a_value_error_and_a_non_str_a_type_error(maker: str) -> None:
    with pytest.raises(ValueError, match=r"containment=...\) must be one of auto, cgroup, scan"):
        MAKERS[maker](containment="cgroups")
    with pytest.raises(TypeError, match=r"containment=...\) must be one of .*, got int 1"):
        MAKERS[maker](containment=1)
