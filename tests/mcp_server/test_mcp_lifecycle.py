"""``zett-agent mcp`` as a process: its command line, what it imports, and that nothing of it
outlives a client that is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: uv sync --extra mcp")

from _mcp_testing import (
    CHILD_TOOLS,
    CHILDREN,
    HANG_GUARD,
    HERE,
    TOOLS,
    ZETT_AGENT,
    fifos,
    reap,
    start_arguments,
)

from support.liveness import alive

pytestmark = pytest.mark.timeout(180)


def run_cli(*args: str, cwd: Path = HERE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZETT_AGENT, "mcp", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


@pytest.mark.parametrize(
    ("target", "says"),
    [
        (
            "no_such_module_here:DEFINITIONS",
            "zett-agent mcp: cannot import 'no_such_module_here': ModuleNotFoundError: No module "
            "named 'no_such_module_here' (is it importable from ",
        ),
        ("_mcp_children", "zett-agent mcp: '_mcp_children' is not MODULE:ATTR; name a module"),
        (
            "_mcp_children.py:DEFINITIONS",
            "zett-agent mcp: '_mcp_children.py' is a file path; give the module's dotted name "
            "(_mcp_children:DEFINITIONS)",
        ),
        ("_mcp_children:NOPE", "zett-agent mcp: '_mcp_children' has no attribute 'NOPE'"),
        (
            "_mcp_children:NOT_DEFINITIONS",
            "zett-agent mcp: _mcp_children:NOT_DEFINITIONS must be a sequence of "
            "SubAgentDefinition (or a function returning one), got int",
        ),
        (
            "_mcp_children:TASK_NAMED",
            "zett-agent mcp: SubAgentDefinition 'task_start' is named like a task tool; every "
            "child is also a tool of its own name, so rename it",
        ),
        (
            "_mcp_children:NO_MODEL",
            "zett-agent mcp: SubAgentDefinition 'orphan' has no model; over MCP there is no "
            "parent model to share",
        ),
    ],
)
def test_a_bad_definitions_target_is_one_line_on_stderr_and_exit_2(target: str, says: str) -> None:
    done = run_cli(target)
    assert done.returncode == 2, done
    assert done.stdout == ""  # the client's wire carries nothing but MCP, never an error
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(says), done.stderr


def test_a_module_that_raises_at_import_is_one_line_too(tmp_path: Path) -> None:
    (tmp_path / "broken_children.py").write_text("import json\nraise RuntimeError('no key')\n")
    done = run_cli("broken_children:DEFINITIONS", cwd=tmp_path)
    assert done.returncode == 2, done
    assert done.stderr == (
        f"zett-agent mcp: cannot import 'broken_children': RuntimeError: no key "
        f"(is it importable from {tmp_path}?)\n"
    )


def test_a_module_that_prints_as_it_loads_prints_to_stderr_not_the_wire(tmp_path: Path) -> None:
    (tmp_path / "loud_children.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\nprint('loading')\n"
        "from _mcp_children import DEFINITIONS\n"
        "def definitions():\n    print('building')\n    return DEFINITIONS\n"
    )
    # stdin at end of file at once: the client went away before it said anything
    done = run_cli("loud_children:definitions", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines()[:2] == ["loading", "building"], done.stderr


def test_a_bad_max_concurrent_is_one_line_and_exit_2() -> None:
    done = run_cli(CHILDREN, "--max-concurrent", "0")
    assert (done.returncode, done.stderr) == (
        2,
        "zett-agent mcp: --max-concurrent must be >= 1, got 0\n",
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--token-file", "t"], "--token-file and --allow-origin go with --http"),
        (["--http", "127.0.0.1:99999"], "--http '127.0.0.1:99999': give [HOST:]PORT with a port"),
        (["--http", "example.com:80"], "--http 'example.com:80': 'example.com' is not an IP"),
        (["--max-task-ttl", "0"], "--max-task-ttl must be from 1 to 31536000 seconds, got 0.0"),
    ],
)
def test_bad_server_options_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    done = run_cli(CHILDREN, *args)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"zett-agent mcp: {says}")


def test_a_bad_token_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    short = tmp_path / "token"
    short.write_text("abc\n")
    done = run_cli(CHILDREN, "--http", "127.0.0.1:0", "--token-file", str(short))
    assert (done.returncode, done.stderr) == (
        2,
        f"zett-agent mcp: the token in {str(short)!r} has 3 characters; use at least 16 (for "
        "example: python -c 'import secrets; print(secrets.token_urlsafe(32))')\n",
    )
    done = run_cli(CHILDREN, "--http", "127.0.0.1:0", "--token-file", str(tmp_path / "none"))
    assert done.returncode == 2
    assert done.stderr.startswith("zett-agent mcp: cannot read the token file")


def test_a_port_in_use_is_one_line_and_exit_2() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(CHILDREN, "--http", f"127.0.0.1:{port}")
    assert done.returncode == 2
    assert done.stderr == (
        f"zett-agent mcp: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )


def test_importing_zett_agent_imports_no_mcp() -> None:
    code = (
        "import sys, zett_agent, zett_agent.cli, zett_agent.extensions.subagent, zett_agent._mcp;"
        "from zett_agent._mcp import _cli, _load, _watch;"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in ('mcp', 'mcp_types')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


@pytest.mark.parametrize("victim", ["client", "server"])
def test_nothing_outlives_a_killed_client_or_server(victim: str, tmp_path: Path) -> None:
    """SIGKILL while a child spins with a grandchild and a task_output call waits for it.

    The client killed: the server sees its stdin close, kills every child's tree and exits by
    itself (status 0), at once, not waiting out the call. The server killed: the process
    engine's launcher kills every tree when its host dies. Either way nothing is left.
    """
    client = subprocess.Popen(
        [sys.executable, str(HERE / "_mcp_client.py"), "auto", ZETT_AGENT, "mcp", CHILDREN],
        cwd=HERE,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    everything: list[int] = []
    try:
        ready = json.loads(client.stdout.readline())
        assert ready["tools"] == [*TOOLS, *CHILD_TOOLS]
        server = int(ready["server_pid"])
        with fifos(tmp_path, "report") as [report]:
            spin = start_arguments("spin", report=report.path)
            client.stdin.write(json.dumps({"id": 1, "tool": "task_start", "arguments": spin}))
            client.stdin.write("\n")
            client.stdin.flush()
            child, grandchild = map(int, report.read_line().split())
            started = json.loads(client.stdout.readline())
            assert started["id"] == 1 and not started["is_error"], started
            task_id = json.loads(started["text"])["task_id"]
            # a call in progress as the client dies: the server does not wait it out
            wait = {"task_id": task_id, "wait_seconds": 600}
            client.stdin.write(json.dumps({"id": 2, "tool": "task_output", "arguments": wait}))
            client.stdin.write("\n")
            client.stdin.flush()
            waiting = json.loads(client.stdout.readline())
            assert waiting["id"] == 2 and "progress" in waiting, waiting
            # everything the server runs, now: its pool's processes, the child, the grandchild
            everything = [server, *(p.pid for p in psutil.Process(server).children(recursive=True))]
            assert {child, grandchild} <= set(everything)
            if victim == "client":
                os.kill(client.pid, signal.SIGKILL)
                assert client.wait(timeout=HANG_GUARD) == -signal.SIGKILL
                statuses = reap(everything)
                # not killed by anyone: it exited of its own accord once its stdin closed
                assert statuses.get(server) == 0, statuses
            else:
                os.kill(server, signal.SIGKILL)
                # the server's orphans come to this (subreaper) process; the server itself
                # stays the client's child until the client is gone
                reap(everything[1:])
                client.kill()
                client.wait(timeout=HANG_GUARD)
                reap([server])
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stdin.close()
        client.stdout.close()
        reap(everything)
    assert everything and not [pid for pid in everything if alive(pid)]
