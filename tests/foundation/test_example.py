"""The guide's program runs unchanged, directly and through ``zett-agent demo``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "_examples" / "async_subagent.py"
EXPECTED = "Background task finished; child session is separate"


def test_example_is_the_seed_program() -> None:
    source = EXAMPLE.read_text(encoding="utf-8")
    assert source.startswith('"""Start a subagent in the background')
    assert source.endswith("    asyncio.run(main())\n")


@pytest.mark.xfail(strict=False, reason="needs the subagent extensions")
def test_guide_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert EXPECTED in done.stdout.splitlines()


@pytest.mark.xfail(strict=False, reason="needs the subagent extensions")
def test_cli_demo_runs_the_example() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "zett_agent.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert EXPECTED in done.stdout.splitlines()


def test_cli_requires_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    from zett_agent.cli import main

    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "demo" in capsys.readouterr().err
