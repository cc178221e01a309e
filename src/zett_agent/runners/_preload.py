"""What a runner imports ahead in its pool's launcher, by module name.

Which modules a definition's children need is found by the extension that holds the
definitions (``zett_agent.extensions._preload``); a runner receives only their names.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["RUNTIME_MODULES", "excluded"]

#: modules every child imports, whatever it runs: the agent runtime and the child entry point
RUNTIME_MODULES: tuple[str, ...] = (
    "zett_agent.agent",
    "zett_agent.runners._child",
    "zett_agent._tracing._span_record",  # a traced child records its spans with it
    "zett_agent.extensions._child_build",
)


def excluded(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``patterns`` or inside one of them (a package)."""
    return any(name == p or name.startswith(p + ".") for p in patterns)
