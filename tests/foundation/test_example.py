"""The async subagent example program runs unchanged, directly and through ``zett-agent demo``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "_examples" / "async_subagent.py"
EXPECTED = "Background task finished; child session is separate"


def test_example_is_the_whole_program_from_docstring_to_asyncio_run() -> None:
    source = EXAMPLE.read_text(encoding="utf-8")
    assert source.startswith('"""Start a subagent in the background')
    assert source.endswith("    asyncio.run(main())\n")


def test_guide_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert EXPECTED in done.stdout.splitlines()
