"""The offline program of docs/offline.md ("Offline: children without a model provider") runs as
written and prints the child's report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "offline.md"
HEADING = "# Offline: children without a model provider"


def test_the_offline_program_runs_as_written(tmp_path: Path) -> None:
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index(HEADING) :]
    begin = section.index("```python\n") + len("```python\n")
    program = section[begin : section.index("\n```\n", begin)]
    script = tmp_path / "offline.py"
    script.write_text(program + "\n")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "Report: login, logout, refresh",
        "completed - login, logout, refresh",
    ]
