"""The README's Python blocks are programs, and they run as written.

Every ```python block of README.md is either byte-identical to a program in ``docs/_examples/``
(the long ones; the file is run by a test below) or is itself run, as is, in a fresh interpreter.
So the README cannot drift from what works. Everything runs offline: the programs choose an
offline model when neither ``OPENAI_API_KEY`` nor ``--base-url`` is given, and the tour is also run
against an OpenAI-compatible endpoint on loopback to cover the real-model path.
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

from _openai_endpoint import OfflineEndpoint

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLES = ROOT / "docs" / "_examples"
HANG_GUARD = 120

#: Each example program and a line its output must contain (None: not a script, tested elsewhere).
EXAMPLE_OUTPUT: dict[str, str | None] = {
    "async_subagent.py": "Background task finished; child session is separate",
    "tour.py": "The auditor says: ",
    "confined.py": "The child runs with umask 0077, RLIMIT_NPROC 64",
    "sandboxed.py": "private file: Permission denied; note in its scratch directory: ok",
    "fastapi_app.py": None,  # an ASGI app: served by uvicorn in test_fastapi_example.py
    "ray_children.py": None,  # needs a Ray cluster: run on the test cluster in tests/ray_runner
}

_FENCE = re.compile(r"^( *)```python\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every ```python block, un-indented as its fence is."""
    blocks = []
    for match in _FENCE.finditer(text):
        indent = len(match.group(1))
        lines = match.group(2).splitlines(keepends=True)
        code = "".join(line[indent:] if line.strip() else line.lstrip(" ") for line in lines)
        blocks.append((text.count("\n", 0, match.start()) + 1, code))
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def offline_env() -> dict[str, str]:
    """This environment without any model endpoint or key: the programs must go offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["NO_PROXY"] = "*"
    return env


def run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=ROOT,
        env=offline_env(),
        check=False,
    )


def test_python_blocks_are_found() -> None:
    # The fence parser sees every block, the indented one in a list included.
    assert len(BLOCKS) == README.read_text(encoding="utf-8").count("```python")
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{n}" for n, _ in BLOCKS])
def test_every_python_block_is_a_program_that_runs(line: int, code: str, tmp_path: Path) -> None:
    shown = {path.read_text(encoding="utf-8"): path for path in EXAMPLES.glob("*.py")}
    if code in shown:
        # A long example, shown whole: its file is run by test_example_programs_run.
        assert shown[code].name in EXAMPLE_OUTPUT
        return
    program = tmp_path / f"readme_line_{line}.py"
    program.write_text(code, encoding="utf-8")
    done = run(program)
    assert done.returncode == 0, f"README.md line {line} failed:\n{done.stderr}"
    assert done.stdout.strip(), f"README.md line {line} printed nothing"


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
