"""Children the MCP server tests serve: ``zett-agent mcp _mcp_children:DEFINITIONS``.

Each child is told what to do by a JSON prompt, and a tool in it talks to the test through
FIFOs the test holds open: it is gated by lines the test writes, or reports pids the test reads.
No child sleeps: each blocks on a FIFO or spins until it is killed.
"""

from __future__ import annotations

import json
import os
import subprocess

from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelRequest
from zett_agent.process import emit
from zett_agent.testing import FunctionModel
from zett_agent.tools import tool


@tool
def step(gate: str, steps: int) -> str:
    """Take ``steps`` steps, each once the test writes a line to the FIFO ``gate``.

    Args:
        gate: the FIFO to read a line from before each step.
        steps: how many steps to take.
    """
    with open(gate) as lines:
        for done in range(1, steps + 1):
            lines.readline()
            emit({"kind": "progress", "done": done, "total": steps})
    return f"took {steps} steps"


@tool
def spin(report: str) -> str:
    """Start a grandchild, write both pids to the FIFO ``report``, then spin forever.

    Args:
        report: the FIFO to write the pids to.
    """
    grandchild = subprocess.Popen(["sleep", "3600"])
    with open(report, "w") as out:
        out.write(f"{os.getpid()} {grandchild.pid}\n")
    while True:
        pass


def act(request: ModelRequest) -> AssistantMessage:
    """Call the tool the prompt names with the prompt's arguments, then report its result."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if results:
        return AssistantMessage(f"report: {results[-1].text}")
    order = json.loads(request.messages[-1].content)
    if not order.get("tool"):
        return AssistantMessage("report: nothing to do")
    return AssistantMessage(tool_calls=[ToolCall("c1", order["tool"], order["arguments"])])


MODEL = FunctionModel(act)

DEFINITIONS = [
    SubAgentDefinition(
        name="worker",
        description="does what its JSON prompt says",
        system_prompt="Follow the JSON order.",
        model=MODEL,
        tools=[step, spin],
    ),
]


def definitions() -> list[SubAgentDefinition]:
    return DEFINITIONS


NOT_DEFINITIONS = 42
NO_MODEL = [SubAgentDefinition("orphan", "has no model", "x")]
TASK_NAMED = [SubAgentDefinition("task_start", "named like a task tool", "x", model=MODEL)]
