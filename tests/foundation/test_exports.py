"""Each public module's ``__all__`` lists exactly its public names, and they all exist."""

from __future__ import annotations

import importlib
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
