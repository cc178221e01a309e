"""Tool arguments checked against a tool's JSON schema: ``validate_arguments``.

Covers the subset of JSON schema the ``tool`` decorator produces and models commonly receive;
every problem found becomes one line of a ``ToolArgumentError``, which the runtime turns into
a failed ``ToolMessage`` the model can correct.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ToolArgumentError", "validate_arguments"]


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
