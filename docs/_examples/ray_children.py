"""Child agents as Ray tasks: the same extension and tools, a different runner.

    python ray_children.py            # starts a local Ray (about 10 s), stops it at the end
    python ray_children.py ADDRESS    # joins a cluster: "auto", "ray://host:10001", "host:6379"

Needs the ray extra (pip install zett-agent[ray]). Offline: both models are scripted here.
"""

import asyncio
import json
import sys
from collections.abc import AsyncIterator

from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions
from zett_agent.runners.ray import RayRunner


class ParentModel:
    """Start two tasks in one turn, then wait for each report and where it ran."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        results = [json.loads(m.text) for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            calls = tuple(
                ToolCall(f"start-{area}", "task_start", {"description": f"Audit {area}", "prompt": area, "subagent_type": "audit"})
                for area in ("auth", "billing")
            )
        elif len(results) == 2:
            calls = tuple(
                ToolCall(f"output-{i}", "task_output", {"task_id": r["task_id"], "wait_seconds": 60})
                for i, r in enumerate(results)
            )
        elif len(results) == 4:
            calls = tuple(
                ToolCall(f"status-{i}", "task_status", {"task_id": r["task_id"]})
                for i, r in enumerate(results[:2])
            )
        else:
            lines = [f"{o['content']} (on node {s['node_id'][:12]})" for o, s in zip(results[2:4], results[4:6], strict=True)]
            yield ModelEvent.completed(ModelResponse(AssistantMessage(content="\n".join(lines))))
            return
        yield ModelEvent.completed(ModelResponse(AssistantMessage(tool_calls=calls)))


class ChildModel:
    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        area = request.messages[-1].content
        yield ModelEvent.completed(ModelResponse(AssistantMessage(content=f"{area}: 3 entry points")))


async def main(address: str | None) -> None:
    definition = SubAgentDefinition(
        name="audit",
        description="audit a code area and report what it finds.",
        system_prompt="You audit code and return a short report.",
        model=ChildModel(),
    )
    # num_cpus: what each child asks Ray for; children that wait on a model need little
    runner = RayRunner(address=address, num_cpus=0.5)
    async with AsyncSubAgentExtension([definition], runner=runner) as extension:
        client = await create_agent(ParentModel(), config=AgentRunConfig(session_id="parent"), extensions=[extension])
        print((await client.run("Audit auth and billing")).content)
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
