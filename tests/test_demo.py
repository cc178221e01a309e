"""``zett-agent demo``: the main job, run as a user would, checked through ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HANG_GUARD = 120


def zett_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zett_agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )


def test_demo_json_shows_parallel_work_a_hard_cancel_and_a_clean_crash(tmp_path: Path) -> None:
    for i in range(8):
        (tmp_path / f"file{i}.txt").write_text(f"content {i}\n" * 100)
    done = zett_agent("demo", str(tmp_path), "--json", "--rounds", "2000", "--hashers", "3")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    by_type: dict[str, list[dict[str, object]]] = {}
    for task in result["tasks"]:
        by_type.setdefault(str(task["subagent_type"]), []).append(task)

    hashers = by_type["hasher"]
    assert [t["status"] for t in hashers] == ["completed"] * 3
    assert sum(int(str(t["content"]).split()[1]) for t in hashers) == 8  # every file hashed once
    assert all(float(str(t["cpu_seconds"])) > 0 for t in hashers)
    [spinner] = by_type["spinner"]
    assert spinner["status"] == "cancelled" and spinner["last_tool"] == "spin_forever"
    [crasher] = by_type["crasher"]
    assert crasher["status"] == "failed" and "SIGSEGV" in str(crasher["error"])
    assert result["files"] == 8
    assert result["cancel_seconds"] is not None and result["cancel_seconds"] > 0
    assert result["children_cpu_seconds"] > 0 and result["wall_seconds"] > 0
    assert result["answer"].startswith("Reports:") and "SIGSEGV" in result["answer"]


def test_demo_plain_view_prints_the_summary(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    done = zett_agent("demo", str(tmp_path), "--plain", "--rounds", "100", "--hashers", "1")
    assert done.returncode == 0, done.stderr
    assert "parallel speedup" in done.stdout
    assert "hard cancel" in done.stdout and "SIGSEGV" in done.stdout


def test_help_explains_the_commands_and_options() -> None:
    top = zett_agent("--help")
    assert top.returncode == 0 and "demo" in top.stdout
    demo = zett_agent("demo", "--help")
    assert demo.returncode == 0
    for option in ("--json", "--plain", "--model", "--base-url", "--hashers", "--rounds"):
        assert option in demo.stdout


def test_demo_refuses_a_missing_folder(tmp_path: Path) -> None:
    done = zett_agent("demo", str(tmp_path / "missing"), "--json")
    assert done.returncode == 2 and "is not a folder" in done.stderr
