"""``zett_agent.errors`` holds every exception the package raises to callers, and its docstring
draws their tree as the classes really are."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import subprocess
import sys

import pytest

import zett_agent.errors as errors

# NodeLost's home needs the ray extra. Ray is not imported here: importing it while tests are
# collected, before Ray's environment is set (support.ray_cluster, which tests/conftest.py
# imports), would fix Ray's constants too early (the test cluster's addresses then leave
# loopback).
WITHOUT_RAY = set() if importlib.util.find_spec("ray") is not None else {"NodeLost"}

#: every public module whose exceptions callers may meet (the ones ``errors`` must name)
PUBLIC_MODULES = [
    "zett_agent.agent",
    "zett_agent.model",
    "zett_agent.tools",
    "zett_agent.testing",
    "zett_agent.process",
    "zett_agent.runners",
    "zett_agent.runners.ray",
    "zett_agent.models",
    "zett_agent.models.openai",
    "zett_agent.extensions",
    "zett_agent.extensions.subagent",
    "zett_agent.extensions.async_subagent",
]

_TREE_LINE = re.compile(r"^    ((?:[│ ]   |[├└]── )*)(\w+)\s{2,}\S")


def drawn_tree() -> dict[str, str | None]:
    """Each class the docstring draws, and the parent it is drawn under (None for a root)."""
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        match = _TREE_LINE.match(line)
        if match is None:
            continue
        depth = len(match.group(1)) // 4
        del stack[depth:]
        parents[match.group(2)] = stack[-1] if stack else None
        stack.append(match.group(2))
    return parents


def test_each_name_is_the_class_of_its_home_module() -> None:
    for name in set(errors.__all__) - WITHOUT_RAY:
        value = getattr(errors, name)
        assert inspect.isclass(value) and issubclass(value, Exception), name
        assert getattr(importlib.import_module(errors._HOMES[name]), name) is value


def test_the_docstring_draws_the_real_tree() -> None:
    drawn = drawn_tree()
    assert set(drawn) == set(errors.__all__)
    for name, parent in drawn.items():
        if name in WITHOUT_RAY:
            continue
        cls = getattr(errors, name)
        ours = [base.__name__ for base in cls.__bases__ if base.__name__ in errors.__all__]
        assert ours == ([parent] if parent else []), f"{name} is drawn under {parent}"


def test_every_public_exception_is_named_here() -> None:
    named = {getattr(errors, name) for name in set(errors.__all__) - WITHOUT_RAY}
    for module_name in PUBLIC_MODULES:
        if WITHOUT_RAY and module_name == "zett_agent.runners.ray":
            continue
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, BaseException):
                assert value in named, f"{module_name}.{name} is missing from zett_agent.errors"


def test_the_naming_rule_holds() -> None:
    outcomes = {"JobFailed", "WorkerCrashed", "JobTimeout", "LimitExceeded", "PoolClosed"}
    outcomes |= {"JobCancelled", "SandboxUnavailable", "NodeLost", "MaxTurnsExceeded"}
    for name, parent in drawn_tree().items():
        if parent is None or name not in outcomes:
            assert name.endswith("Error"), name


def test_builtin_kinds_are_kept() -> None:
    assert issubclass(errors.ToolArgumentError, ValueError)
    assert issubclass(errors.UnknownToolError, LookupError)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        errors.Nope  # noqa: B018


def test_importing_it_imports_none_of_the_homes() -> None:
    code = (
        "import sys, zett_agent.errors\n"
        "homes = ('zett_agent.process', 'zett_agent.agent', 'ray')\n"
        "print([m for m in homes if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
