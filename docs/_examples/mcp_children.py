"""Child agents for `zett-agent mcp`: an MCP client starts them in the background.

    zett-agent mcp docs._examples.mcp_children:definitions        # from the repository root

With OPENAI_API_KEY set the children run on the OpenAI API (ZETT_MODEL names the model,
default gpt-4o-mini); without it, on an offline model from zett_agent.testing, so the server
works with no key at all.
"""

import json
import os
import re
from pathlib import Path

from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import Model, ModelRequest
from zett_agent.process import ProcessLimits, emit
from zett_agent.testing import FunctionModel
from zett_agent.tools import tool


@tool
def count_lines(folder: str) -> str:
    """Count the lines of every Python file in a folder, reporting progress file by file.

    Args:
        folder: the folder to look in (not its subfolders).
    """
    files = sorted(Path(folder).glob("*.py"))
    counts = {}
    for done, path in enumerate(files, 1):
        counts[path.name] = len(path.read_text(errors="replace").splitlines())
        # Progress the MCP client sees while it waits in task_output.
        emit({"kind": "progress", "done": done, "total": len(files)})
    return json.dumps(counts)


def offline(request: ModelRequest) -> AssistantMessage:
    """Stands in for an LLM: calls count_lines on the folder the prompt names, then reports."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        found = re.search(r"(/\S+)", request.messages[-1].content)
        folder = found.group(1).rstrip(".") if found else "."
        return AssistantMessage(tool_calls=[ToolCall("c1", "count_lines", {"folder": folder})])
    counts = json.loads(results[0].text)
    lines = ", ".join(f"{name}: {n}" for name, n in counts.items())
    return AssistantMessage(f"{len(counts)} files, {sum(counts.values())} lines ({lines})")


def choose_model() -> Model:
    if os.environ.get("OPENAI_API_KEY"):
        from zett_agent.models.openai import OpenAIChatModel

        return OpenAIChatModel(os.environ.get("ZETT_MODEL", "gpt-4o-mini"))
    return FunctionModel(offline)


def definitions() -> list[SubAgentDefinition]:
    """What the server offers; called once, when it starts."""
    return [
        SubAgentDefinition(
            name="line_counter",
            description="count the lines of the Python files in a folder",
            system_prompt="Count lines with count_lines and report the totals briefly.",
            model=choose_model(),  # every definition served over MCP brings its own model
            tools=[count_lines],  # runs in the child's process
            limits=ProcessLimits(timeout=300, memory_bytes=2 * 2**30),
            max_turns=10,
        ),
    ]
