"""Tools: results, the decorator's schemas, and argument validation messages."""

from __future__ import annotations

import enum
from typing import Any, Literal

import pytest

from zett_agent.tools import AgentTool, ToolArgumentError, ToolResult, tool, validate_arguments


def test_tool_result_text_and_error() -> None:
    assert ToolResult("plain").text == "plain"
    assert ToolResult({"a": [1, "é"]}).text == '{"a": [1, "é"]}'
    assert ToolResult(3).text == "3"
    failed = ToolResult.error("no such file")
    assert failed.is_error and failed.text == "no such file"


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_decorator_builds_the_schema_from_hints_and_docstring() -> None:
    @tool(guidelines="Use for searching.")
    async def search(
        query: str,
        limit: int = 10,
        ratio: float | None = None,
        tags: list[str] | None = None,
        mode: Literal["fast", "full"] = "fast",
        strict: bool = False,
        options: dict[str, Any] | None = None,
        color: Color = Color.RED,
    ) -> str:
        """Search the index for documents.

        Longer explanation that is not part of the description.

        Args:
            query: The words to look for.
            limit (int): How many results
                to return at most.
            mode: Fast or full.

        Returns:
            Matching documents.
        """
        return query

    assert isinstance(search, AgentTool)
    assert search.name == "search"
    assert search.description == "Search the index for documents."
    assert search.guidelines == "Use for searching."
    params = search.parameters
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "The words to look for."}
    assert props["limit"] == {
        "type": "integer",
        "description": "How many results to return at most.",
        "default": 10,
    }
    assert props["ratio"] == {"type": ["number", "null"], "default": None}
    assert props["tags"] == {
        "type": ["array", "null"],
        "items": {"type": "string"},
        "default": None,
    }
    assert props["mode"] == {
        "enum": ["fast", "full"],
        "type": "string",
        "description": "Fast or full.",
        "default": "fast",
    }
    assert props["strict"] == {"type": "boolean", "default": False}
    assert props["options"]["type"] == ["object", "null"]
    assert props["color"] == {"enum": ["red", "blue"], "type": "string", "default": "red"}
    assert search.spec.name == "search" and search.spec.parameters is params


async def test_invoke_calls_sync_and_async_handlers_with_keywords() -> None:
    @tool(name="add_numbers", description="Add two numbers.")
    def add(a: int, b: int = 2) -> int:
        return a + b

    @tool
    async def paint(color: Color) -> ToolResult:
        """Paint."""
        assert isinstance(color, Color)
        return ToolResult(f"painted {color.name}")

    assert add.name == "add_numbers"
    assert await add.invoke({"a": 1}) == ToolResult(3)
    assert (await paint.invoke({"color": "blue"})).text == "painted BLUE"


async def test_invoke_validates_before_calling_the_handler() -> None:
    called: list[Any] = []

    @tool
    def f(n: int) -> None:
        """F."""
        called.append(n)

    with pytest.raises(ToolArgumentError) as info:
        await f.invoke({"n": True, "extra": 1})
    assert called == []
    assert info.value.errors == (
        "argument 'n' must be an integer, got boolean true",
        "unexpected argument 'extra'; expected only: 'n'",
    )
    assert isinstance(info.value, ValueError)


def test_decorator_needs_a_description_and_supported_types() -> None:
    with pytest.raises(ValueError, match="needs a description"):

        @tool
        def undocumented(x: int) -> int:
            return x

    with pytest.raises(TypeError, match=r"parameter 'x'.*not supported"):

        @tool
        def weird(x: complex) -> None:
            """Weird."""


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 4},
        "count": {"type": "integer", "minimum": 1, "maximum": 3},
        "ratio": {"type": "number"},
        "mode": {"enum": ["a", "b"]},
        "paths": {"type": "array", "items": {"type": "string"}},
        "nested": {
            "type": "object",
            "properties": {"flag": {"type": "boolean"}},
            "required": ["flag"],
        },
    },
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing required argument 'name'"),
        ({"name": "x"}, "argument 'name' must be at least 2 characters long, got 1"),
        ({"name": "abcde"}, "argument 'name' must be at most 4 characters long, got 5"),
        ({"name": "ab", "count": 0}, "argument 'count' must be >= 1, got 0"),
        ({"name": "ab", "count": 4}, "argument 'count' must be <= 3, got 4"),
        ({"name": "ab", "count": 1.5}, "argument 'count' must be an integer, got number 1.5"),
        ({"name": "ab", "ratio": "1"}, "argument 'ratio' must be a number, got string \"1\""),
        ({"name": "ab", "mode": "c"}, 'argument \'mode\' must be one of "a", "b"; got "c"'),
        ({"name": "ab", "paths": ["a", 2]}, "argument 'paths[1]' must be a string, got integer 2"),
        ({"name": "ab", "nested": {}}, "missing required argument 'nested.flag'"),
        ({"name": "ab", "other": 1}, "unexpected argument 'other'"),
        ("not an object", "the arguments must be a JSON object, got string"),
    ],
)
def test_validation_messages_name_the_argument_and_the_expectation(
    arguments: Any, message: str
) -> None:
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments("t", SCHEMA, arguments)
    assert any(message in error for error in info.value.errors), info.value.errors
    assert str(info.value).startswith("Invalid arguments for tool 't': ")


def test_valid_arguments_pass() -> None:
    validate_arguments(
        "t",
        SCHEMA,
        {"name": "ab", "count": 2, "ratio": 1, "mode": "a", "paths": [], "nested": {"flag": True}},
    )


def test_agent_tool_checks_its_name() -> None:
    with pytest.raises(ValueError, match="tool name"):
        AgentTool("has space", "d", {}, lambda: None)
