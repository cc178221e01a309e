"""Tools the model may call: results, schemas, argument validation and the ``tool`` decorator."""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, overload

from zett_agent._model import ToolSpec

__all__ = [
    "AgentTool",
    "ToolArgumentError",
    "ToolResult",
    "UnknownToolError",
    "schema_for_function",
    "tool",
    "validate_arguments",
]


@dataclass(slots=True)
class ToolResult:
    """What a tool handler returns to the model.

    ``content`` is a string (sent as is) or any JSON-compatible value (sent as JSON text).
    ``is_error`` marks the call as failed, so the model sees a failed ``ToolMessage``.

    Mutable on purpose: an ``after_tool`` hook may change ``content`` or ``is_error`` in place,
    and the changed result is what is appended, persisted and sent to the next model request.
    The runtime hands ``after_tool`` its own copy, so a handler that returns one shared
    ``ToolResult`` object every time never sees another call's changes.
    """

    content: Any
    is_error: bool = False

    @property
    def text(self) -> str:
        """The content as the model reads it: a string unchanged, anything else as JSON."""
        if isinstance(self.content, str):
            return self.content
        return json.dumps(self.content, ensure_ascii=False, default=str)

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """A failed result whose text tells the model what went wrong."""
        return cls(message, is_error=True)


class ToolArgumentError(ValueError):
    """The model called a tool with arguments that do not match its JSON schema.

    ``errors`` holds one line per problem, each naming the argument, what was wrong and what is
    expected. The runtime turns this into a failed ``ToolMessage``; it never ends the run.
    """

    def __init__(self, tool_name: str, errors: Sequence[str]):
        self.tool_name = tool_name
        self.errors = tuple(errors)
        super().__init__(
            f"Invalid arguments for tool {tool_name!r}: " + "; ".join(self.errors) + ". "
            f"Fix the arguments and call {tool_name!r} again."
        )


class UnknownToolError(LookupError):
    """The model called a tool that is not registered for this request."""

    def __init__(self, name: str, available: Sequence[str]):
        self.name = name
        self.available = tuple(available)
        listing = ", ".join(sorted(self.available)) or "(none)"
        super().__init__(
            f"Unknown tool {name!r}. Available tools: {listing}. "
            "Call one of these by its exact name."
        )


# --------------------------------------------------------------------------------------------
# JSON-schema validation (the subset the decorator produces and models commonly receive)

_JSON_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def _json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _matches_type(value: Any, type_name: str) -> bool:
    actual = _json_type_of(value)
    if type_name == "number":
        return actual in ("integer", "number")
    return actual == type_name


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _validate(schema: Mapping[str, Any], value: Any, where: str, errors: list[str]) -> None:
    subject = f"argument {where!r}" if where else "the arguments"
    expected_type = schema.get("type")
    if expected_type is not None:
        allowed = [expected_type] if isinstance(expected_type, str) else list(expected_type)
        if not any(_matches_type(value, t) for t in allowed):
            wanted = " or ".join(_JSON_TYPE_NAMES.get(t, t) for t in allowed)
            errors.append(f"{subject} must be {wanted}, got {_json_type_of(value)} {_show(value)}")
            return
    if "enum" in schema and value not in list(schema["enum"]):
        choices = ", ".join(_show(c) for c in schema["enum"])
        errors.append(f"{subject} must be one of {choices}; got {_show(value)}")
        return
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{subject} must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{subject} must be <= {schema['maximum']}, got {value}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                f"{subject} must be at least {schema['minLength']} characters long, "
                f"got {len(value)}"
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(
                f"{subject} must be at most {schema['maxLength']} characters long, got {len(value)}"
            )
    if isinstance(value, list | tuple) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            _validate(schema["items"], item, f"{where}[{index}]", errors)
    if isinstance(value, Mapping):
        _validate_object(schema, value, where, errors)


def _validate_object(
    schema: Mapping[str, Any], value: Mapping[str, Any], where: str, errors: list[str]
) -> None:
    properties: Mapping[str, Any] = schema.get("properties") or {}
    prefix = f"{where}." if where else ""
    for name in schema.get("required") or ():
        if name not in value:
            described = properties.get(name, {}).get("description")
            hint = f" ({described})" if described else ""
            errors.append(f"missing required argument {prefix + name!r}{hint}")
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            _validate(properties[name], item, prefix + name, errors)
        elif extra is False:
            known = ", ".join(repr(k) for k in properties) or "none"
            errors.append(f"unexpected argument {prefix + name!r}; expected only: {known}")
        elif isinstance(extra, Mapping):
            _validate(extra, item, prefix + name, errors)


def validate_arguments(tool_name: str, schema: Mapping[str, Any], arguments: Any) -> None:
    """Check ``arguments`` against a JSON schema.

    Supports ``type`` (a name or a list of names), ``required``, ``properties``,
    ``additionalProperties``, ``enum``, ``minimum``/``maximum``, ``minLength``/``maxLength`` and
    ``items``; other keywords are ignored.

    Raises:
        ToolArgumentError: listing every problem found, each naming the argument.
    """
    errors: list[str] = []
    if not isinstance(arguments, Mapping):
        errors.append(f"the arguments must be a JSON object, got {_json_type_of(arguments)}")
    else:
        _validate(schema, arguments, "", errors)
    if errors:
        raise ToolArgumentError(tool_name, errors)


# --------------------------------------------------------------------------------------------
# Tools


ToolHandler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class AgentTool:
    """A tool the model may call.

    ``parameters`` is the JSON schema of the keyword arguments; ``handler`` is a sync or async
    callable invoked with those keyword arguments. Sync handlers run on the event loop thread,
    so they must be quick; offload blocking work yourself. ``guidelines`` is optional usage
    guidance for the system prompt (see ``ToolGuidelinesExtension``).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler = field(repr=False)
    guidelines: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ValueError(
                f"tool name {self.name!r} must be 1-64 characters of letters, digits, _ . -"
            )
        if not callable(self.handler):
            raise TypeError(f"handler of tool {self.name!r} must be callable")

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)

    async def invoke(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Validate ``arguments`` against the schema, call the handler, return its result.

        A ``ToolResult`` returned by the handler is used as is; any other value ``v`` becomes
        ``ToolResult(v)``.

        Raises:
            ToolArgumentError: the arguments do not match the schema (the handler is not called).
            Exception: whatever the handler raises, unchanged.

        Cancellation: cancels an async handler; a sync handler runs to completion first.
        """
        validate_arguments(self.name, self.parameters, arguments)
        value = self.handler(**dict(arguments))
        if inspect.isawaitable(value):
            value = await value
        return value if isinstance(value, ToolResult) else ToolResult(value)


# --------------------------------------------------------------------------------------------
# The decorator

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


@overload
def tool(fn: Callable[..., Any], /) -> AgentTool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    guidelines: str | None = None,
) -> Callable[[Callable[..., Any]], AgentTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    guidelines: str | None = None,
) -> AgentTool | Callable[[Callable[..., Any]], AgentTool]:
    """Turn a typed sync or async function into an :class:`AgentTool`.

    The JSON schema comes from the type hints (``str``, ``int``, ``float``, ``bool``,
    ``list[...]``, ``dict``, ``Literal[...]``, Enums, ``Optional[...]``, defaults); the
    description is the docstring's first paragraph and an ``Args:`` section describes each
    parameter. Use bare (``@tool``) or with options (``@tool(name=..., guidelines=...)``).

    Raises:
        TypeError: a parameter type cannot be expressed as JSON schema.
        ValueError: the tool has no description (write a docstring or pass ``description``).
    """

    def build(func: Callable[..., Any]) -> AgentTool:
        doc_description, parameters = schema_for_function(func)
        final_description = description if description is not None else doc_description
        tool_name = name or func.__name__
        if not final_description:
            raise ValueError(
                f"tool {tool_name!r} needs a description: give the function a docstring "
                "or pass description=..."
            )
        return AgentTool(
            name=tool_name,
            description=final_description,
            parameters=parameters,
            handler=_enum_adapter(func),
            guidelines=guidelines,
        )

    if fn is not None:
        return build(fn)
    return build
