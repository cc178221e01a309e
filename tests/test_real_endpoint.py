"""A brokered child on a real LLM server (``../shared/tools/real_llm.sh``), skipped without one.

    ../shared/tools/real_llm.sh              # prints the base URL, http://127.0.0.1:8088/v1
    uv run pytest -m real_llm tests/test_real_endpoint.py

``$ZETT_REAL_LLM_URL`` names another OpenAI-compatible server. The child runs in its own process
through the default ``ProcessRunner()``: its calls are brokered, so the parent calls the server
with the SDK and the child holds a stand-in.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request

import pytest

from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.runners import ChildSpec, ProcessRunner

pytestmark = pytest.mark.real_llm

URL = os.environ.get("ZETT_REAL_LLM_URL", "http://127.0.0.1:8088/v1").rstrip("/")
HANG_GUARD = 300


def served_model() -> str | None:
    """The first model the server lists, or ``None`` when no server answers."""
    try:
        with urllib.request.urlopen(f"{URL}/models", timeout=2) as response:
            models = json.load(response)["data"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(models[0]["id"]) if models else None


async def test_a_brokered_child_answers_from_the_real_model() -> None:
    name = await asyncio.to_thread(served_model)
    if name is None:
        pytest.skip(f"no OpenAI-compatible server at {URL} (start ../shared/tools/real_llm.sh)")
    model = OpenAIChatModel(name, base_url=URL, timeout=HANG_GUARD, max_tokens=32)
    definition = SubAgentDefinition(
        "real", "answers briefly", "Answer in one short sentence.", model=model
    )
    async with ProcessRunner() as runner, asyncio.timeout(HANG_GUARD):
        job = await runner.submit(ChildSpec(definition, model, "real/1", "Name a colour."))
        await job.wait()
        info = dict(job.info())
    assert job.exception() is None, job.exception()
    assert job.result()["content"].strip()
    assert info["broker"]["calls"] >= 1  # the parent made the call
