"""Each public module's ``__all__`` lists exactly its public names, and they all exist."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

PUBLIC_MODULES = [
    "zett_agent.messages",
    "zett_agent.model",
    "zett_agent.tools",
    "zett_agent.events",
    "zett_agent.agent",
    "zett_agent.client",
    "zett_agent.extensions",
    "zett_agent.testing",
    "zett_agent.extensions.subagent",
    "zett_agent.extensions.async_subagent",
    "zett_agent.extensions.tool_guidelines",
    "zett_agent.process",
    "zett_agent.runners",
    "zett_agent.models",
    "zett_agent.models.openai",
    "zett_agent.cli",
]


def public_names(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and name not in ("annotations", "TYPE_CHECKING")  # __future__ and typing plumbing
        and not isinstance(value, types.ModuleType)  # submodules and imported modules
    }


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_lists_exactly_the_public_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    assert set(exported) == public_names(module)
    for name in exported:
        assert getattr(module, name) is not None


FIRST_PROGRAM = """
import sys
import zett_agent
light = not {"httpx", "zett_agent.agent", "zett_agent.process"} & set(sys.modules)
from zett_agent import AsyncSubAgentExtension, SubAgentDefinition, create_agent, tool
from zett_agent import AgentRunConfig, OpenAIChatModel, ProcessLimits, Sandbox, ScriptedModel
model = OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1")
no_httpx = not {"httpx", "httpcore", "h11", "anyio"} & set(sys.modules)
print(light, create_agent.__module__, OpenAIChatModel.__module__, no_httpx)
"""


def test_a_first_program_imports_its_names_from_the_package() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FIRST_PROGRAM], capture_output=True, text=True, check=True
    )
    # import zett_agent alone loads none of them: child processes import the package too
    # nor does building the model adapter: its SDK (and its httpx) is imported at its first call
    assert out.stdout.split() == [
        "True",
        "zett_agent._runtime._client",
        "zett_agent.models._openai",
        "True",
    ]


def test_the_package_exports_each_name_from_its_home_module() -> None:
    package = importlib.import_module("zett_agent")
    exported = list(package.__all__)
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    assert set(exported) == {"__version__", *package._HOMES}
    assert set(exported) <= set(dir(package))
    for name, home in package._HOMES.items():
        assert getattr(package, name) is getattr(importlib.import_module(home), name), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        package.nope  # noqa: B018
