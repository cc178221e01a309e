"""The layers of the package and its imports: the contracts hold, and no import circle exists.

The layering rules are import-linter contracts in ``pyproject.toml`` (``lint-imports`` runs them
in CI; so does a test here). They count every import, inside functions and under
``TYPE_CHECKING`` too. The circle test reads the run-time imports only (module level and inside
functions, not ``TYPE_CHECKING``): an import circle among them is an import order that can fail.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import zett_agent

PACKAGE = Path(zett_agent.__file__).parent
ROOT = PACKAGE.parent.parent
RUNNERS = PACKAGE / "runners"


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


def test_the_layering_contracts_hold() -> None:
    """``lint-imports`` over the contracts of ``pyproject.toml``, as CI runs it."""
    command = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run(
        [str(command), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


# -- import circles -----------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (imports for annotations only)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    inside.update(id(sub) for sub in ast.walk(child))
    return inside


def _run_time_imports(source: str, module: str, package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ``known`` that ``module`` imports at run time (lazily too)."""
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    here = module.split(".") if package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = here[: len(here) - node.level + 1]
                base = ".".join([*parent, node.module or ""]).strip(".")
            else:
                base = node.module or ""
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                yield target


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _graph(files: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    known = set(files)
    return {
        module: set(_run_time_imports(source, module, package, known))
        for module, (source, package) in files.items()
    }


def test_no_run_time_import_circle() -> None:
    files = {
        _module_name(path): (path.read_text(), path.name == "__init__.py")
        for path in PACKAGE.rglob("*.py")
    }
    assert len(files) > 150  # the scan found the package
    assert _circles(_graph(files)) == []


def test_the_circle_scan_sees_a_lazy_circle_and_not_a_type_checking_one() -> None:
    lazy = {
        "p": ("", True),
        "p.a": ("from p import b\n", False),
        "p.b": ("def f():\n    from . import a\n", False),
        "p.c": ("from p.d import X\n", False),
        "p.d": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.c import Y\n",
            False,
        ),
    }
    assert _circles(_graph(lazy)) == [["p.a", "p.b"]]
