"""The runners know only their own protocol: no module of zett_agent.runners imports extensions."""

from __future__ import annotations

import ast
from pathlib import Path

import zett_agent.runners

RUNNERS = Path(zett_agent.runners.__file__).parent


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an import statement names, wherever it is (lazy, TYPE_CHECKING too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append((node.lineno, f"{'.' * node.level}{node.module or ''}"))
    return found


def test_no_runners_module_imports_extensions() -> None:
    modules = sorted(RUNNERS.rglob("*.py"))
    assert len(modules) > 10  # the scan found the package
    bad = [
        f"{path.relative_to(RUNNERS)}:{line}: {name}"
        for path in modules
        for line, name in _imports(ast.parse(path.read_text(), str(path)))
        if name == "zett_agent.extensions"
        or name.startswith("zett_agent.extensions.")
        or name.startswith("..extensions")
    ]
    assert bad == []


def test_the_scan_sees_a_lazy_import() -> None:
    code = "def f():\n    from zett_agent.extensions._subagent import X\n"
    assert (2, "zett_agent.extensions._subagent") in _imports(ast.parse(code))
