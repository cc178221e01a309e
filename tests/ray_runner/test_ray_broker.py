"""RayRunner refuses brokered children (for now), before anything reaches Ray."""

from __future__ import annotations

import pytest

from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.runners import ChildSpec
from zett_agent.runners.ray import RayRunner
from zett_agent.testing import ScriptedModel

pytestmark = pytest.mark.ray


async def test_a_brokered_spec_is_refused_with_the_reason() -> None:
    model = ScriptedModel(["never"])
    definition = SubAgentDefinition("worker", "test child", "You are a test child.", model=model)
    runner = RayRunner()
    try:
        with pytest.raises(ValueError, match="RayRunner does not broker model calls yet"):
            await runner.submit(ChildSpec(definition, model, "parent/task-1", "do it", broker=True))
    finally:
        await runner.close()
