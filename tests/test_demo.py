"""``zett-agent demo``: the main job, run as a user would, checked through ``--json``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.scripts import offline_env, zett_agent

HANG_GUARD = 120


def folder(path: Path, files: int = 8) -> Path:
    for i in range(files):
        (path / f"file{i}.txt").write_text(f"content {i}\n" * 100)
    return path


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
    # the sandboxed child tried to read a file of the parent's, outside its sandbox
    [snooper] = by_type["snooper"]
    sandbox = snooper["sandbox"]
    assert isinstance(sandbox, dict) and snooper["status"] == "completed"
    if sandbox.get("filesystem"):
        assert "was denied: Permission denied" in str(snooper["content"]), snooper
    else:  # a kernel without Landlock: the demo runs all the same, and says so
        assert "not confined here" in str(snooper["content"]), snooper
    assert result["files"] == 8 and result["files_hashed"] == 8
    assert sorted(t["progress"]["total"] for t in hashers) == [2, 3, 3]  # 8 files in 3 shards
    assert all(t["progress"]["done"] == t["progress"]["total"] for t in hashers)
    assert result["timed_out"] is False
    assert 0 <= result["parent_loop_p99_stall_ms"] <= result["parent_loop_max_stall_ms"]
    assert result["cancel_seconds"] is not None and result["cancel_seconds"] > 0
    assert result["children_cpu_seconds"] > 0 and result["wall_seconds"] > 0
    assert result["answer"].startswith("Reports:") and "SIGSEGV" in result["answer"]


def test_demo_plain_view_prints_progress_and_the_summary(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    done = zett_agent("demo", str(tmp_path), "--plain", "--rounds", "100", "--hashers", "1")
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stdout.splitlines() if "files hashed:" in line]
    assert progress and progress[-1].split("files hashed:")[1].split()[:3] == ["1", "of", "1"]
    assert "parallel speedup" in done.stdout
    assert "hard cancel" in done.stdout and "SIGSEGV" in done.stdout
    assert "sandbox: task-" in done.stdout


def test_help_explains_the_commands_and_options() -> None:
    top = zett_agent("--help")
    assert top.returncode == 0 and "demo" in top.stdout
    demo = zett_agent("demo", "--help")
    assert demo.returncode == 0
    for option in (
        "--json",
        "--plain",
        "--model",
        "--base-url",
        "--hashers",
        "--rounds",
        "--timeout",
    ):
        assert option in demo.stdout


def test_demo_refuses_a_missing_folder(tmp_path: Path) -> None:
    done = zett_agent("demo", str(tmp_path / "missing"), "--json")
    assert done.returncode == 2 and "is not a folder" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hashers", "0"], "--hashers must be between 1 and 128"),
        (["--hashers", "129"], "--hashers must be between 1 and 128"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds"),
        (["--timeout", "nan"], "--timeout must be a positive number of seconds"),
        (["--timeout", "soon"], "invalid float value: 'soon'"),
        (["--hashers", "many"], "invalid int value: 'many'"),
        (["--model", "gpt-4o"], "must look like 'PROVIDER:MODEL_NAME'"),
        (["--model", "openai:gpt-4o-mini"], "set OPENAI_API_KEY in the environment"),
        (["--base-url", "http://127.0.0.1:1/v1"], "--base-url needs --model too"),
    ],
)
def test_bad_arguments_get_one_line_and_no_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = zett_agent("demo", str(folder(tmp_path, 1)), "--json", *args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_file_or_an_empty_folder_is_refused_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".git").mkdir()
    (tmp_path / "empty" / ".git" / "HEAD").write_text("skipped")
    done = zett_agent("demo", str(tmp_path / "empty"))
    assert done.returncode == 2 and "has no files to hash" in done.stderr
    (tmp_path / "a.txt").write_text("a")
    done = zett_agent("demo", str(tmp_path / "a.txt"))
    assert done.returncode == 2 and "is not a folder" in done.stderr
    assert "Traceback" not in done.stderr


def test_more_hashers_than_max_retained_read_every_report(tmp_path: Path) -> None:
    """99 hashers, a spinner, a crasher and a snooper: 102 tasks, more than the default
    max_retained."""
    done = zett_agent("demo", str(folder(tmp_path)), "--json", "--hashers", "99", "--rounds", "10")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    statuses = [(t["subagent_type"], t["status"]) for t in result["tasks"]]
    assert statuses.count(("hasher", "completed")) == 99
    assert result["files_hashed"] == 8
    assert result["answer"].count("(hasher) completed") == 99


def test_a_large_run_is_warned_about_and_timeout_stops_it_cleanly(tmp_path: Path) -> None:
    done = zett_agent(
        "demo", str(folder(tmp_path)), "--json", "--rounds", "100000000", "--timeout", "2"
    )
    assert done.returncode == 1
    warning, stopped = done.stderr.splitlines()
    assert warning.startswith("zett-agent demo: warning: 8 files") and "--rounds" in warning
    assert "--timeout 2 s will stop it first" in warning
    assert stopped.startswith("zett-agent demo: stopped by --timeout 2 after 2.")
    result = json.loads(done.stdout)
    assert result["timed_out"] is True
    by_type = {t["subagent_type"]: t["status"] for t in result["tasks"]}
    assert by_type == {
        "hasher": "cancelled",
        "spinner": "cancelled",
        "crasher": "failed",
        "snooper": "completed",
    }


def test_ctrl_c_stops_the_demo_without_a_traceback(tmp_path: Path) -> None:
    """SIGINT to the demo's whole process group, as a terminal's Ctrl-C sends it."""
    command = [sys.executable, "-m", "zett_agent.cli", "demo", str(folder(tmp_path))]
    process = subprocess.Popen(
        [*command, "--plain", "--rounds", "100000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=offline_env(),
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # wait until the children run
            if "running" in line:
                break
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=HANG_GUARD)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "interrupted; every child's process tree was killed" in err
    assert "Traceback" not in err


def test_an_unreachable_model_endpoint_ends_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    done = zett_agent(
        "demo",
        str(folder(tmp_path, 1)),
        "--json",
        "--model",
        "openai:local",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
    )
    assert done.returncode == 1
    assert "the parent agent failed: could not talk to the model endpoint" in done.stderr
    assert "Traceback" not in done.stderr
