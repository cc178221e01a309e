"""The Python blocks of README.md and of every page in docs/ are programs, and they run as written.

Every ```python block of README.md and of ``docs/**/*.md`` is either byte-identical to a program
in ``docs/_examples/`` (the long ones; the file is run by a test below, or elsewhere where it
needs a server or a Ray cluster) or is itself run, as is, in a fresh interpreter. A block right
after the line ``<!-- notebook cell: run with top-level await in __main__ -->`` is run the way a
notebook runs a cell: compiled with top-level ``await`` and run in ``__main__`` while an event
loop runs. So the pages cannot drift from what works. Everything runs offline: the programs
choose an offline model when neither ``OPENAI_API_KEY`` nor ``--base-url`` is given, and the tour
is also run against an OpenAI-compatible endpoint on loopback to cover the real-model path.
"""

from __future__ import annotations

import asyncio
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from support.openai_endpoint import OfflineEndpoint

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "_examples"
#: every page whose Python blocks must run: the README and the documentation site's pages
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
HANG_GUARD = 120

#: Each example program and a line its output must contain (None: not a script, tested elsewhere).
EXAMPLE_OUTPUT: dict[str, str | None] = {
    "async_subagent.py": "Background task finished; child session is separate",
    "tour.py": "The auditor says: ",
    "confined.py": "The child runs with umask 0077, RLIMIT_NPROC 64",
    "sandboxed.py": "private file: Permission denied; note in its scratch directory: ok",
    "steering.py": "restored: task-2 failed - token budget exceeded (used 6000 of 1000 tokens)",
    "fastapi_app.py": None,  # an ASGI app: served by uvicorn in test_fastapi_example.py
    "ray_children.py": None,  # needs a Ray cluster: run on the test cluster in tests/ray_runner
    "mcp_children.py": None,  # a definitions module: served by zett-agent mcp in tests/mcp_server
    "mcp_task_client.py": "tasks/result: ",
    "mcp_http_client.py": "report: ",
}

_FENCE = re.compile(r"^( *)```python\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)
NOTEBOOK_MARK = "<!-- notebook cell: run with top-level await in __main__ -->"

#: Runs the file named by its argument as a notebook runs a cell: top-level ``await`` allowed,
#: the cell's names in ``__main__`` (so what it defines travels by value, as from a notebook),
#: inside a running event loop.
NOTEBOOK_RUNNER = """
import ast, asyncio, sys
import __main__
path = sys.argv[1]
with open(path, encoding="utf-8") as handle:
    cell = compile(handle.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
async def run_cell():
    pending = eval(cell, vars(__main__))
    if pending is not None:
        await pending
asyncio.run(run_cell())
"""


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """``(line number, code, is a notebook cell)`` of every ```python block, un-indented as its
    fence is."""
    blocks = []
    for match in _FENCE.finditer(text):
        indent = len(match.group(1))
        lines = match.group(2).splitlines(keepends=True)
        code = "".join(line[indent:] if line.strip() else line.lstrip(" ") for line in lines)
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, code, before == NOTEBOOK_MARK))
    return blocks


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


BLOCKS = [
    (page_name(page), line, code, notebook)
    for page in PAGES
    for line, code, notebook in python_blocks(page.read_text(encoding="utf-8"))
]


def offline_env() -> dict[str, str]:
    """This environment without any model endpoint or key: the programs must go offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["NO_PROXY"] = "*"
    return env


def run(path: Path, *args: str, notebook: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", NOTEBOOK_RUNNER] if notebook else [sys.executable]
    return subprocess.run(
        [*command, str(path), *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=ROOT,
        env=offline_env(),
        check=False,
    )


def test_python_blocks_are_found() -> None:
    # The fence parser sees every block of every page, indented ones included.
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert len(python_blocks(text)) == text.count("```python"), page_name(page)
    assert len([b for b in BLOCKS if b[0] == "README.md"]) >= 1
    assert len(BLOCKS) >= 10
    assert any(notebook for *_, notebook in BLOCKS)  # the notebook cell is found as one


def test_a_notebook_mark_names_the_block_right_after_it() -> None:
    text = f"x\n\n{NOTEBOOK_MARK}\n```python\nawait f()\n```\n\n```python\nprint(1)\n```\n"
    assert [notebook for _, _, notebook in python_blocks(text)] == [True, False]


@pytest.mark.parametrize(
    ("page", "line", "code", "notebook"), BLOCKS, ids=[f"{p}:{n}" for p, n, _, _ in BLOCKS]
)
def test_every_python_block_is_a_program_that_runs(
    page: str, line: int, code: str, notebook: bool, tmp_path: Path
) -> None:
    shown = {path.read_text(encoding="utf-8"): path for path in EXAMPLES.glob("*.py")}
    if code in shown:
        # A long example, shown whole: its file is run by test_example_programs_run.
        assert shown[code].name in EXAMPLE_OUTPUT
        return
    program = tmp_path / f"{Path(page).stem}_line_{line}.py"
    program.write_text(code, encoding="utf-8")
    done = run(program, notebook=notebook)
    assert done.returncode == 0, f"{page} line {line} failed:\n{done.stderr}"
    assert done.stdout.strip(), f"{page} line {line} printed nothing"
    assert "Traceback" not in done.stderr, f"{page} line {line}:\n{done.stderr}"


def test_every_example_program_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXAMPLE_OUTPUT)


@pytest.mark.parametrize("name", [n for n, line in EXAMPLE_OUTPUT.items() if line is not None])
def test_example_programs_run_offline(name: str) -> None:
    done = run(EXAMPLES / name)
    assert done.returncode == 0, done.stderr
    expected = EXAMPLE_OUTPUT[name]
    assert expected is not None and expected in done.stdout, done.stdout
    assert "Traceback" not in done.stderr


def test_the_tour_says_which_model_it_chose() -> None:
    done = run(EXAMPLES / "tour.py")
    assert done.stdout.startswith("(no OPENAI_API_KEY and no --base-url: an offline model")


async def test_the_tour_runs_on_an_openai_compatible_endpoint() -> None:
    """``--base-url``: the parent and the child talk HTTP to the endpoint, no offline model."""
    offline = runpy.run_path(str(EXAMPLES / "tour.py"))["offline"]
    async with OfflineEndpoint(offline) as endpoint:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLES / "tour.py"),
            "--base-url",
            endpoint.url,
            "--model",
            "local-model",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=offline_env(),
            cwd=ROOT,
        )
        async with asyncio.timeout(HANG_GUARD):
            out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("The auditor says: "), lines
    assert {body["model"] for body in endpoint.requests} == {"local-model"}
    child_calls = [
        b
        for b in endpoint.requests
        if any(t["function"]["name"] == "count_lines" for t in b.get("tools", ()))
    ]
    assert len(child_calls) == 2  # the child's two turns, from its own process
    assert len(endpoint.requests) == 5  # and the parent's three
