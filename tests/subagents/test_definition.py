"""``SubAgentDefinition`` checks every field at construction: a mistake fails at its own line,
with a message that names the field and the fix, instead of later inside a child."""

from __future__ import annotations

from typing import Any

import pytest

from zett_agent.extensions import Extension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.process import ProcessLimits
from zett_agent.testing import ScriptedModel
from zett_agent.tools import AgentTool, tool


def define(**fields: Any) -> SubAgentDefinition:
    base: dict[str, Any] = {"name": "w", "description": "d", "system_prompt": "p"}
    return SubAgentDefinition(**{**base, **fields})


def count_words(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text to count.
    """
    return len(text.split())


async def test_a_plain_function_in_tools_is_wrapped_as_a_tool() -> None:
    @tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    definition = define(tools=[count_words, shout])
    wrapped, kept = definition.tools
    assert kept is shout
    assert isinstance(wrapped, AgentTool) and wrapped.name == "count_words"
    assert wrapped.description == "Count the words of a text."
    assert wrapped.parameters["properties"]["text"]["type"] == "string"
    assert (await wrapped.invoke({"text": "a b c"})).content == 3


def test_a_function_that_cannot_be_a_tool_is_a_type_error_naming_the_field() -> None:
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(TypeError, match=r"tools\[1\].*undocumented.*docstring.*@zett_agent"):
        define(tools=[count_words, undocumented])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"limits": {"timeout": 1}},
            r"limits=\.\.\.\) must be a zett_agent.process.ProcessLimits.*dict",
        ),
        ({"limits": 30}, r"limits=\.\.\.\) must be .*ProcessLimits\(timeout="),
        ({"tools": "read_file"}, r"tools=\.\.\.\) must be a list, got str"),
        ({"tools": [42]}, r"tools\[0\] must be an AgentTool .* got int 42"),
        ({"tools": [str]}, r"tools\[0\] must be an AgentTool"),
        ({"tools": count_words}, r"tools=\.\.\.\) must be a list"),
        ({"extensions": [Extension]}, r"extensions\[0\] .* not the class"),
        ({"extensions": ["ToolGuidelines"]}, r"extensions\[0\] must be an Extension instance"),
        ({"model": "gpt-4o-mini"}, r"model=\.\.\.\) must be a Model .* got str 'gpt-4o-mini'"),
        ({"max_turns": 2.5}, r"max_turns=\.\.\.\) must be an int"),
        ({"max_turns": True}, r"max_turns=\.\.\.\) must be an int"),
        ({"name": None}, r"name=\.\.\.\) must be a str"),
        ({"system_prompt": ["p"]}, r"system_prompt=\.\.\.\) must be a str"),
    ],
)
def test_a_wrong_type_is_a_type_error_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message) as caught:
        define(**fields)
    assert "SubAgentDefinition" in str(caught.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "has spaces"}, "identifier"),
        ({"description": "  "}, "needs a description"),
        ({"max_turns": 0}, r"max_turns=\.\.\.\) must be at least 1, got 0"),
        ({"tools": [count_words, count_words]}, "two tools share a name: count_words"),
    ],
)
def test_a_bad_value_is_a_value_error(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        define(**fields)


def test_valid_fields_are_kept_as_given() -> None:
    model = ScriptedModel(["ok"])
    limits = ProcessLimits(timeout=5)
    definition = SubAgentDefinition("w", "d", "p", model, (), [Extension()], limits, 3)
    assert definition.model is model and definition.limits is limits
    assert definition.max_turns == 3 and definition.tools == ()
    assert isinstance(definition.extensions, tuple) and len(definition.extensions) == 1
    with pytest.raises(AttributeError):
        definition.name = "other"  # type: ignore[misc]
