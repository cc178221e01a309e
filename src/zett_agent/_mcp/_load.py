"""Finding the children to serve: ``MODULE:ATTR`` names a sequence of ``SubAgentDefinition``s."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from zett_agent._checks import repeated_names
from zett_agent.extensions._definition import SubAgentDefinition

#: the most definitions one server offers (each is a profile the client's model may choose)
MAX_DEFINITIONS = 100

#: the task tools' names, which a child's own tool cannot take
TASK_TOOL_NAMES = ("task_start", "task_list", "task_status", "task_output", "task_cancel")


class DefinitionsError(Exception):
    """``MODULE:ATTR`` does not name servable definitions.

    Its message says why and how to fix it, in one line.
    """


def load_definitions(target: str) -> tuple[SubAgentDefinition, ...]:
    """Import ``MODULE`` and return the definitions its ``ATTR`` names.

    ``ATTR`` is a dotted path inside the module to a sequence of ``SubAgentDefinition``s, or to
    a callable that takes no arguments and returns one. The current directory is put first on
    ``sys.path`` (as ``python -m`` does), so a module of the project the server is started in is
    found, and so is it in the children, which get the server's ``sys.path``. What the module
    (or the callable) prints goes to stderr: stdout is the MCP client's wire.

    Every definition needs its own ``model``: over MCP there is no parent model for
    ``model=None`` to mean.

    Raises:
        DefinitionsError: the target is malformed, the module cannot be imported (its error's
            last line is named), the attribute is missing, or it holds no valid definitions.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise DefinitionsError(
            f"{target!r} is not MODULE:ATTR; name a module and the definitions in it, for "
            "example myproject.children:DEFINITIONS"
        )
    if module_name.endswith(".py") or os.sep in module_name:
        dotted = module_name.removesuffix(".py").replace(os.sep, ".").strip(".")
        raise DefinitionsError(
            f"{module_name!r} is a file path; give the module's dotted name ({dotted}:{attr}) "
            "and start the server in the directory it is imported from"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        # stdout is the client's wire: a module that prints as it loads writes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # a module that exits at import is a bad module too
        raise DefinitionsError(
            f"cannot import {module_name!r}: {_last_line(exc)} (is it importable from {cwd}?)"
        ) from exc
    value: object = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise DefinitionsError(
                f"{module_name!r} has no attribute {attr!r}; name the sequence of "
                "SubAgentDefinition objects (or a function returning one) it defines"
            ) from None
    if callable(value) and not isinstance(value, SubAgentDefinition):
        try:
            with contextlib.redirect_stdout(sys.stderr):
                value = value()
        except Exception as exc:
            raise DefinitionsError(f"{target}() raised {_last_line(exc)}") from exc
    return _check(target, value)


def _check(target: str, value: object) -> tuple[SubAgentDefinition, ...]:
    if isinstance(value, SubAgentDefinition):
        raise DefinitionsError(f"{target} is one SubAgentDefinition; make it a list: [definition]")
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise DefinitionsError(
            f"{target} must be a sequence of SubAgentDefinition (or a function returning one), "
            f"got {type(value).__name__}"
        )
    definitions = tuple(value)
    if not definitions:
        raise DefinitionsError(f"{target} is empty; give at least one SubAgentDefinition")
    if len(definitions) > MAX_DEFINITIONS:
        raise DefinitionsError(
            f"{target} has {len(definitions)} definitions; at most {MAX_DEFINITIONS} are served"
        )
    for index, definition in enumerate(definitions):
        if not isinstance(definition, SubAgentDefinition):
            raise DefinitionsError(
                f"{target}[{index}] must be a SubAgentDefinition, got {type(definition).__name__}"
            )
        if definition.name in TASK_TOOL_NAMES:
            raise DefinitionsError(
                f"SubAgentDefinition {definition.name!r} is named like a task tool; every child "
                "is also a tool of its own name, so rename it"
            )
        if definition.model is None:
            raise DefinitionsError(
                f"SubAgentDefinition {definition.name!r} has no model; over MCP there is no "
                "parent model to share, so give it one: SubAgentDefinition(..., model=...)"
            )
    repeated = repeated_names(d.name for d in definitions)
    if repeated:
        raise DefinitionsError(f"subagent names must be unique; repeated: {', '.join(repeated)}")
    return definitions


def _last_line(exc: BaseException) -> str:
    """The exception as its traceback's last line says it, cut to one short line."""
    line = traceback.format_exception_only(type(exc), exc)[-1].strip().replace("\n", " ")
    return line if len(line) <= 300 else line[:300] + "..."
