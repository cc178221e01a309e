"""The tour: a parent agent delegates an audit to a child agent in its own process.

    uv run python docs/_examples/tour.py                     # offline (no key, no --base-url)
    OPENAI_API_KEY=... uv run python docs/_examples/tour.py  # the OpenAI API
    uv run python docs/_examples/tour.py --base-url http://127.0.0.1:8000/v1 --model qwen2.5:7b
"""

import argparse
import asyncio
import json
import os
import re

from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.extensions.tool_guidelines import ToolGuidelinesExtension
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import Model, ModelRequest
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.process import ProcessLimits
from zett_agent.testing import FunctionModel
from zett_agent.tools import tool

THIS_FILE = os.path.abspath(__file__)


@tool
def count_lines(path: str) -> int:
    """Count the lines of a text file.

    Args:
        path: the file to read.
    """
    with open(path) as handle:
        return sum(1 for _ in handle)


auditor = SubAgentDefinition(
    name="audit",
    description="audit a code area and report what it finds",
    system_prompt="You audit code and return a short report.",
    tools=[count_lines],                 # runs in the child's process
    limits=ProcessLimits(timeout=300, memory_bytes=2 * 2**30, cpu_seconds=120),
    max_turns=30,
)                                        # model=None: the parent's model


def offline(request: ModelRequest) -> AssistantMessage:
    """Stands in for an LLM, offline: plays the child or the parent, by the tools it is offered."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if any(spec.name == "count_lines" for spec in request.tools):  # the child
        if not results:
            path = re.search(r"\S+\.py", request.messages[0].content).group()
            return AssistantMessage(tool_calls=[ToolCall("c1", "count_lines", {"path": path})])
        return AssistantMessage(f"{results[0].text} lines, one module: fine as it is.")
    if not results:                                                     # the parent
        prompt = request.messages[0].content
        start = {"subagent_type": "audit", "description": "audit", "prompt": prompt}
        return AssistantMessage(tool_calls=[ToolCall("p1", "task_start", start)])
    if len(results) == 1:
        read = {"task_id": json.loads(results[0].text)["task_id"], "wait_seconds": 60}
        return AssistantMessage(tool_calls=[ToolCall("p2", "task_output", read)])
    return AssistantMessage("The auditor says: " + json.loads(results[1].text)["content"])


def choose_model() -> Model:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint, e.g. a local server")
    parser.add_argument("--model", default="gpt-4o-mini", help="the model name it knows")
    args = parser.parse_args()
    if args.base_url:
        return OpenAIChatModel(args.model, base_url=args.base_url)
    if os.environ.get("OPENAI_API_KEY"):
        return OpenAIChatModel(args.model)
    print("(no OPENAI_API_KEY and no --base-url: an offline model from zett_agent.testing)")
    return FunctionModel(offline)


async def main(model: Model) -> None:
    async with AsyncSubAgentExtension([auditor], max_concurrent=4) as tasks:
        client = await create_agent(
            model,
            config=AgentRunConfig(session_id="alice"),
            extensions=[tasks, ToolGuidelinesExtension()],
        )
        prompt = (
            f"Start an audit task in the background for {THIS_FILE} (count its lines), "
            "then wait for its report with task_output and tell me what it found."
        )
        print((await client.run(prompt)).content)


if __name__ == "__main__":
    asyncio.run(main(choose_model()))
