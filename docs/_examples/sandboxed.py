"""Run a child agent in a sandbox: it reads and writes only what its Sandbox allows."""

import asyncio
import json
import os
import tempfile

from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.process import Sandbox, sandbox_support
from zett_agent.testing import FunctionModel
from zett_agent.tools import tool


def attempt(action) -> str:
    try:
        action()
    except OSError as exc:
        return exc.strerror
    return "ok"


@tool
def look(shared: str, private: str) -> str:
    """Read a shared file and a private one, write a note; say what worked."""
    return json.dumps(
        {
            "shared file": attempt(lambda: open(shared).read()),
            "private file": attempt(lambda: open(private).read()),
            "note in its scratch directory": attempt(lambda: open("note.txt", "w").write("hi")),
            "environment": sorted(os.environ),
        }
    )


def child(request):  # offline models: the child calls its tool with the paths it was given
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        paths = json.loads(request.messages[-1].content)
        return AssistantMessage(tool_calls=[ToolCall("c", "look", paths)])
    return results[0].text


def parent(paths):  # the parent starts one task, waits for its report, and tells what it saw
    def model(request):
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            start = {"subagent_type": "worker", "description": "look", "prompt": paths}
            return AssistantMessage(tool_calls=[ToolCall("s", "task_start", start)])
        if len(results) == 1:
            read = {"task_id": json.loads(results[0].text)["task_id"], "wait_seconds": 30}
            return AssistantMessage(tool_calls=[ToolCall("o", "task_output", read)])
        task = json.loads(results[1].text)
        seen = json.loads(task["content"])
        what = "; ".join(f"{k}: {v}" for k, v in seen.items() if k != "environment")
        enforced = {k: task["sandbox"][k] for k in ("landlock_abi", "seccomp", "user", "network")}
        return (
            f"The sandboxed child: {what}. Its environment: {', '.join(seen['environment'])}. "
            f"Enforced: {enforced}"
        )

    return model


async def main() -> None:
    support = sandbox_support()  # what this machine can enforce, and why not the rest
    print(f"Landlock ABI {support['landlock_abi']}, seccomp {support['seccomp']}", end=": ")
    with tempfile.TemporaryDirectory() as shared, tempfile.NamedTemporaryFile() as private:
        with open(os.path.join(shared, "data.txt"), "w") as handle:
            handle.write("for the child")
        paths = json.dumps({"shared": os.path.join(shared, "data.txt"), "private": private.name})
        worker = SubAgentDefinition(
            "worker",
            "looks around",
            "You report.",
            model=FunctionModel(child),
            tools=[look],
            # it may read the shared folder (and what the interpreter needs), write only its
            # own scratch directory, open no socket; required (the default): on a machine that
            # cannot enforce all of it, the task fails with SandboxUnavailable instead
            sandbox=Sandbox(read=[shared]),
        )
        async with AsyncSubAgentExtension([worker]) as tasks:
            client = await create_agent(FunctionModel(parent(paths)), extensions=[tasks])
            print((await client.run("What may a sandboxed child do?")).content)


if __name__ == "__main__":
    asyncio.run(main())
