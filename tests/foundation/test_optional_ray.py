"""Ray is an optional extra: importing zett_agent (runners included) never imports it."""

from __future__ import annotations

from support.scripts import python_prints


def test_importing_zett_agent_never_imports_ray() -> None:
    code = (
        "import sys\n"
        "import zett_agent, zett_agent.agent, zett_agent.client, zett_agent.process\n"
        "import zett_agent.runners, zett_agent.extensions.async_subagent\n"
        "import zett_agent.extensions.subagent, zett_agent.cli\n"
        "loaded = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
        "print(loaded)\n"
    )
    printed = python_prints(code)
    assert printed == "[]", printed
