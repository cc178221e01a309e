"""A web service whose agents start background child agents, each in its own OS process.

    uv run uvicorn fastapi_app:app --app-dir docs/_examples --timeout-graceful-shutdown 30

    curl -X POST localhost:8000/sessions/alice/chat -H 'content-type: application/json' \\
         -d '{"text": "count the primes below 200000"}'
    curl 'localhost:8000/sessions/alice/tasks/task-1?wait=30'

The model: an OpenAI-compatible server when OPENAI_BASE_URL is set, the OpenAI API when
OPENAI_API_KEY is, otherwise an offline model from zett_agent.testing (ZETT_MODEL names the
model, default gpt-4o-mini).
"""

import json
import math
import os
import re
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from zett_agent.agent import Agent, AgentRunConfig
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import Model, ModelRequest
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.process import ProcessLimits, ProcessPool
from zett_agent.testing import FunctionModel
from zett_agent.tools import tool


@tool
def count_primes(below: int) -> int:
    """Count the prime numbers below a bound (pure CPU work, in the child's process).

    Args:
        below: the exclusive upper bound.
    """
    return sum(1 for n in range(2, below) if all(n % d for d in range(2, math.isqrt(n) + 1)))


counter = SubAgentDefinition(
    name="primes",
    description="count prime numbers (CPU-heavy)",
    system_prompt="Answer with count_primes and report the number in one sentence.",
    tools=[count_primes],
    limits=ProcessLimits(timeout=600, cpu_seconds=300),
)


def offline(request: ModelRequest) -> AssistantMessage:
    """Stands in for an LLM, offline: plays the child or the parent, by the tools it is offered."""
    last_user = max(i for i, m in enumerate(request.messages) if isinstance(m, UserMessage))
    text, results = request.messages[last_user].content, request.messages[last_user + 1 :]
    results = [m for m in results if isinstance(m, ToolMessage)]
    if any(spec.name == "count_primes" for spec in request.tools):  # the child
        below = int(re.search(r"\d+", text).group())
        if not results:
            return AssistantMessage(tool_calls=[ToolCall("c", "count_primes", {"below": below})])
        return AssistantMessage(f"There are {results[0].text} primes below {below}.")
    if not results:                                                     # the parent
        start = {"subagent_type": "primes", "description": text[:60], "prompt": text}
        return AssistantMessage(tool_calls=[ToolCall("s", "task_start", start)])
    if results[0].failed:
        return AssistantMessage(f"Could not start it: {results[0].text}")
    return AssistantMessage(f"Started {json.loads(results[0].text)['task_id']} in the background.")


def choose_model() -> Model:
    name = os.environ.get("ZETT_MODEL", "gpt-4o-mini")
    if os.environ.get("OPENAI_BASE_URL"):
        return OpenAIChatModel(name, base_url=os.environ["OPENAI_BASE_URL"])
    if os.environ.get("OPENAI_API_KEY"):
        return OpenAIChatModel(name)
    print("fastapi_app: no OPENAI_API_KEY or OPENAI_BASE_URL: an offline model", flush=True)
    return FunctionModel(offline)


@asynccontextmanager
async def lifespan(app: FastAPI):
    # One pool, extension and agent for the application's lifetime; leaving them kills every
    # child. The children's tools live in this module, so the pool's launcher imports it (and
    # FastAPI) once, and every child starts warm instead of importing the web stack again.
    async with (
        ProcessPool(max_workers=16, preload=[__name__], nice=10) as pool,
        AsyncSubAgentExtension([counter], pool=pool, max_concurrent=4) as tasks,
        Agent(choose_model(), extensions=[tasks]) as agent,
    ):
        app.state.tasks, app.state.agent = tasks, agent
        yield


app = FastAPI(lifespan=lifespan)


class Chat(BaseModel):
    text: str


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/sessions/{session}/chat")
async def chat(session: str, chat: Chat) -> dict[str, str]:
    result = await app.state.agent.run(chat.text, config=AgentRunConfig(session_id=session))
    return {"answer": result.content}


@app.get("/sessions/{session}/tasks")
async def list_tasks(session: str) -> list[dict]:
    return [app.state.tasks.task_info(t) for t in app.state.tasks.tasks(session)]


@app.get("/sessions/{session}/tasks/{task_id}")
async def read_task(session: str, task_id: str, wait: float = 0) -> dict:
    """The task and its report; ``wait`` seconds (at most 600) to let it finish first."""
    task = find(session, task_id)
    task = await app.state.tasks.wait(task, min(max(wait, 0), 600))
    return app.state.tasks.task_info(task, include_output=True)


@app.delete("/sessions/{session}/tasks/{task_id}")
async def cancel_task(session: str, task_id: str) -> dict:
    task = await app.state.tasks.cancel(find(session, task_id))
    return app.state.tasks.task_info(task, include_output=True)


def find(session: str, task_id: str):
    try:
        return app.state.tasks.get_task(session, task_id)
    except ValueError as error:
        raise HTTPException(status_code=404, detail=str(error)) from None
