"""A tool's JSON schema from a Python function: its type hints, defaults and docstring.

``schema_for_function`` builds what the model is told about a function's parameters; the
``tool`` decorator (``zett_agent._tools``) uses it, with ``_enum_adapter`` to turn the JSON
values of Enum parameters back into members.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from zett_agent._tool_args import _json_type_of

__all__ = ["schema_for_function"]

_SIMPLE_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for_type(annotation: Any, where: str) -> dict[str, Any]:
    if annotation is Any or annotation is inspect.Parameter.empty:
        return {}
    if annotation in _SIMPLE_TYPES:
        return {"type": _SIMPLE_TYPES[annotation]}
    if annotation is type(None):
        return {"type": "null"}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        return _enum_schema(values)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if annotation in (list, tuple, Sequence) or origin in (list, tuple, Sequence):
        schema: dict[str, Any] = {"type": "array"}
        item_args = [a for a in args if a is not Ellipsis]
        if len(item_args) == 1:
            schema["items"] = _schema_for_type(item_args[0], f"{where}[]")
        return schema
    if annotation in (dict, Mapping) or origin in (dict, Mapping):
        schema = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = _schema_for_type(args[1], f"{where}.*")
        return schema
    if origin is Literal:
        return _enum_schema(list(args))
    if origin in (Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        nullable = len(non_null) != len(args)
        if len(non_null) == 1:
            inner = _schema_for_type(non_null[0], where)
            return _nullable(inner) if nullable else inner
        options = [_schema_for_type(a, where) for a in non_null]
        if all(set(o) == {"type"} and isinstance(o["type"], str) for o in options):
            names = [o["type"] for o in options] + (["null"] if nullable else [])
            return {"type": names}
        raise TypeError(
            f"parameter {where!r}: unions of {annotation!r} are not supported; use one type, "
            "Optional[...] or Literal[...]"
        )
    raise TypeError(
        f"parameter {where!r}: type {annotation!r} is not supported; use str, int, float, bool, "
        "list[...], dict, Literal[...], an Enum or Optional[...]"
    )


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"enum": values}
    kinds = {_json_type_of(v) for v in values}
    if len(kinds) == 1:
        schema["type"] = kinds.pop()
    return schema


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    result = dict(schema)
    if "enum" in result:
        result["enum"] = [*result["enum"], None]
    kind = result.get("type")
    if isinstance(kind, str):
        result["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        result["type"] = [*kind, "null"]
    return result


_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?|Cancellation):\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its first paragraph and per-argument descriptions."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        summary.append(line.strip())
    described: dict[str, str] = {}
    in_args = False
    current: str | None = None
    args_indent: int | None = None
    for line in lines:
        stripped = line.strip()
        header = _SECTION.match(stripped)
        if header and (len(line) - len(line.lstrip())) == 0:
            in_args = header.group(1) in ("Args", "Arguments", "Parameters")
            current, args_indent = None, None
            continue
        if not in_args or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if args_indent is None:
            args_indent = indent
        match = _ARG_LINE.match(stripped)
        if indent <= args_indent and match:
            current = match.group(1).lstrip("*")
            described[current] = match.group(2).strip()
        elif current is not None:
            described[current] = (described[current] + " " + stripped).strip()
    return " ".join(summary), described


def schema_for_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """Build ``(description, JSON schema)`` for ``fn`` from its type hints and docstring.

    Raises:
        TypeError: a parameter has no supported type, or is positional-only or ``*args``.
    """
    description, arg_docs = _parse_docstring(inspect.getdoc(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # unresolvable forward references
        raise TypeError(
            f"cannot resolve the type hints of {getattr(fn, '__qualname__', fn)!r}: {exc}"
        ) from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    additional = False
    for param in inspect.signature(fn).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            additional = True
            continue
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            raise TypeError(
                f"parameter {param.name!r} of {fn.__qualname__}: tools are called with keyword "
                "arguments, so positional-only and *args parameters are not supported"
            )
        schema = _schema_for_type(hints.get(param.name, Any), param.name)
        if arg_docs.get(param.name):
            schema["description"] = arg_docs[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        else:
            default = param.default.value if isinstance(param.default, enum.Enum) else param.default
            try:
                json.dumps(default)
            except (TypeError, ValueError):
                pass
            else:
                schema["default"] = default
        properties[param.name] = schema
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    result["additionalProperties"] = additional
    return description, result


def _enum_adapter(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Convert JSON values back to the Enum members the function's hints ask for."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return fn
    enums = {
        name: hint
        for name, hint in hints.items()
        if isinstance(hint, type) and issubclass(hint, enum.Enum) and name != "return"
    }
    if not enums:
        return fn

    def convert(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: enums[k](v) if k in enums and v is not None else v for k, v in kwargs.items()}

    if inspect.iscoroutinefunction(fn):

        async def async_wrapper(**kwargs: Any) -> Any:
            return await fn(**convert(kwargs))

        async_wrapper.__wrapped__ = fn  # type: ignore[attr-defined]  # for inspect.unwrap
        return async_wrapper

    def wrapper(**kwargs: Any) -> Any:
        return fn(**convert(kwargs))

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]  # for inspect.unwrap
    return wrapper
