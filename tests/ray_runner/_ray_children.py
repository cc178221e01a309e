"""What the Ray tests run as children: functions and agent tools (imported by name in the Ray
workers; the cluster's PYTHONPATH holds this folder and ``tests/``).

Children that the test must watch report to it through a datagram socket
(``support.children.beacon``): every node of the test cluster is this machine. The behaviours
every runner shares (segfault, gates, marks, ...) are in ``support.children``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any

from support.children import announce, beacon, schema
from support.children import burn as burn_cpu
from support.survivors import record
from zett_agent.runners.ray import emit
from zett_agent.tools import AgentTool

PR_SET_CHILD_SUBREAPER = 36


def echo(value: Any, events: int = 0) -> Any:
    for i in range(events):
        emit({"i": i})
    return {"value": value, "pid": os.getpid()}


async def echo_async(value: Any) -> Any:
    emit({"async": True})
    return value


def raises(message: str) -> None:
    raise ValueError(message)


def segfault() -> None:
    emit("about to crash")
    ctypes.string_at(0)


def hard_exit(code: int) -> None:
    os._exit(code)


def not_json() -> Any:
    return {1, 2}


def start_tree() -> dict[str, int]:
    """Start a plain child and a ``setsid`` double-fork escapee; return the pids."""
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    read, write = os.pipe()
    escaper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "if os.fork():\n    os._exit(0)\n"
            "os.setsid()\n"
            f"os.write({write}, str(os.getpid()).encode())\n"
            "time.sleep(3600)\n",
        ],
        pass_fds=(write,),
    )
    escaper.wait()
    os.close(write)
    escapee = int(os.read(read, 32))
    os.close(read)
    return {"worker": os.getpid(), "plain": plain.pid, "escapee": escapee}


def spin_with_tree(seconds: float = 3600.0) -> None:
    """Start a tree, report its pids as an event, then spin in pure Python, never yielding."""
    emit(start_tree())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _pids_matching(text: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(name))
    return found


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        data = handle.read()
    return int(data[data.rindex(b")") + 2 :].split()[1])


def lineage() -> dict[str, Any]:
    """This child's pool's launcher (its parent), the launcher's parent, and whether that is a
    zygote (its command line) and the Ray worker's child."""
    launcher = os.getppid()
    above = _parent_of(launcher)
    with open(f"/proc/{above}/cmdline", "rb") as handle:
        zygote = b"_zygote" in handle.read()
    return {"launcher": launcher, "above": above, "zygote": zygote}


def supervisors() -> dict[str, int]:
    """The processes that supervise this child on its node: its pool's launcher (its parent),
    the launcher's parent (the node's zygote template, whose parent, the zygote's gate, is
    taken too; or the Ray worker that hosts the pool, when the pool started its launcher
    itself), and the node's reaper actors."""
    launcher = os.getppid()
    above = _parent_of(launcher)
    found = {"launcher": launcher, "above_launcher": above}
    with open(f"/proc/{above}/cmdline", "rb") as handle:
        if b"_zygote" in handle.read():
            found["zygote_gate"] = _parent_of(above)
    for i, pid in enumerate(_pids_matching("ray::Reaper")):
        found[f"reaper{i}"] = pid
    return found


def hostile(stop_supervisors: bool = True) -> None:
    """A child that fights its containment, then spins.

    With ``stop_supervisors`` it waits until its node has a zett reaper actor, then sends
    ``SIGSTOP`` to every supervisor it finds (``supervisors``), noting which signals the kernel
    let through. Always: clears its worker's subreaper flag and starts a grandchild that clears
    its environment, double-forks and calls ``setsid``. Reports the pids it started and what
    it stopped.
    """
    stopped: list[int] = []
    refused: list[int] = []
    if stop_supervisors:
        deadline = time.monotonic() + 60  # the reaper starts with the child (a hang guard)
        while not _pids_matching("ray::Reaper") and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in supervisors().values():
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except PermissionError:
                refused.append(pid)
            except ProcessLookupError:
                pass
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    read, write = os.pipe()
    escaper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\n"
            "if os.fork():\n    os._exit(0)\n"
            "os.setsid()\n"
            "if os.fork():\n    os._exit(0)\n"
            f"os.write({write}, str(os.getpid()).encode())\n"
            "time.sleep(3600)\n",
        ],
        env={},  # no marker: invisible to a scan by environment
        pass_fds=(write,),
    )
    escaper.wait()
    os.close(write)
    escapee = int(os.read(read, 32))
    os.close(read)
    emit({"worker": os.getpid(), "escapee": escapee, "stopped": stopped, "refused": refused})
    while True:
        pass


def tree_then_return() -> dict[str, int]:
    """Leave a plain child and a setsid escapee behind, then return normally."""
    return start_tree()


def tree_then_segfault(beacon_path: str) -> None:
    """Start a tree, tell the test its pids, then crash the worker.

    Through a beacon, not ``emit``: an event still in the worker when it crashes is lost.
    """
    beacon(beacon_path, start_tree())
    ctypes.string_at(0)


def burn(seconds: float) -> float:
    """CPU-bound pure Python for about ``seconds`` of CPU time."""
    start = time.process_time()
    n = 0
    while time.process_time() - start < seconds:
        for _ in range(10_000):
            n += 1
    return time.process_time() - start


def allocate(megabytes: int) -> int:
    chunk = bytearray(megabytes * 2**20)
    return len(chunk)


def wait_forever() -> None:
    emit({"pid": os.getpid()})
    time.sleep(3600)


# -- agent tools for the extension tests -------------------------------------------------------


def _spin_tree(beacon_path: str) -> str:
    """Start a tree, tell the test its pids, spin forever (pure Python, never yields)."""
    beacon(beacon_path, start_tree())
    while True:
        pass


def _announce_and_wait(beacon_path: str, label: str) -> str:
    announce(beacon_path, label)
    time.sleep(3600)
    return "unreachable"


def _wait_for_gate(gate: str) -> str:
    """Return what the test writes to the FIFO ``gate`` (the child runs until then)."""
    with open(gate, "rb") as fifo:
        return fifo.read().decode()


def _burn(seconds: float) -> str:
    """Burn ``seconds`` of CPU; return when it started and ended (CLOCK_MONOTONIC, which every
    node of the test cluster shares)."""
    started = time.monotonic()
    burn_cpu(seconds)
    return f"{started} {time.monotonic()}"


def _progress() -> str:
    from zett_agent.process import emit as process_emit  # what child tools use everywhere

    process_emit({"kind": "progress", "done": 2, "total": 3})
    return "reported"


SPIN_TREE = AgentTool("spin_tree", "Spin.", schema(beacon_path="string"), _spin_tree)
ANNOUNCE = AgentTool(
    "announce", "Wait.", schema(beacon_path="string", label="string"), _announce_and_wait
)
BURN = AgentTool("burn", "Burn CPU.", schema(seconds="number"), _burn)
GATE = AgentTool("gate", "Wait for the gate.", schema(gate="string"), _wait_for_gate)
PROGRESS = AgentTool("progress", "Report progress.", schema(), _progress)


# -- children that try what a hostile (or careless) child would -----------------------------------


def quiet_helper_then_segfault(beacon_path: str) -> None:
    """Case 2: a tool starts a helper with ``start_new_session=True`` and a minimal environment
    (``PATH``, ``LANG``; the subreaper flag left alone), the helper starts its command, and
    then the worker segfaults. Reports the pids through a beacon first."""
    helper = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 3600 & echo $!; exec >&-; wait"],
        start_new_session=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        stdout=subprocess.PIPE,
    )
    assert helper.stdout is not None
    command = int(helper.stdout.readline())
    helper.stdout.close()
    beacon(beacon_path, {"worker": os.getpid(), "helper": helper.pid, "command": command})
    ctypes.string_at(0)


def thread_starts_a_process_later(gate: str) -> dict[str, int]:
    """Case 3: leave a thread that waits on the FIFO ``gate`` and then starts a process; return
    at once. A worker that outlived its job with this thread would run it into whatever comes
    next (or nothing would ever kill what it starts)."""

    def later() -> None:
        with open(gate, "rb") as fifo:  # opens once the test writes to the gate
            fifo.read()
        subprocess.Popen(["sleep", "3600"])

    import threading

    threading.Thread(target=later, daemon=True).start()
    return {"worker": os.getpid()}


def return_lone_surrogate() -> dict[str, str]:
    return {"report": "r" + "\ud800"}


def raw_lone_surrogate_frame() -> None:
    """Write, by hand, an event frame whose JSON escapes a lone surrogate into the result
    channel (bypassing ``emit``'s check); then wait to be killed."""
    from zett_agent.process._child._worker import _channel_fd
    from zett_agent.process._wire._protocol import HEADER

    payload = b'{"k":"event","v":{"kind":"progress","note":"\\udfff"}}'
    os.write(_channel_fd(), HEADER.pack(len(payload)) + payload)
    time.sleep(600)


def amplify(items: int) -> Any:
    """A small JSON text that decodes into a lot of memory: ``[{}, {}, ...]``."""
    return [{}] * items


def many_events(count: int, size: int) -> str:
    """``count`` events of ``size`` characters each, which nobody reads; then return."""
    chunk = "x" * size
    for _ in range(count):
        emit(chunk)
    return "emitted"


def hopping_lineages(path: str, lineages: int) -> None:
    """Case 6: ``lineages`` processes that each fork a successor and exit, over and over (so
    every pid a scan found is gone by the time it is signalled); every hop records itself in
    ``path``. Emits once they all run, then spins."""
    for _ in range(lineages):
        if os.fork() == 0:
            try:
                while True:
                    record(path)
                    if os.fork() != 0:
                        os._exit(0)
            finally:
                os._exit(0)
    emit("hopping")
    while True:
        pass


class LoneSurrogateModel:
    """A child's model that calls a tool whose name holds a lone surrogate, then answers with a
    report that holds one (what a model server's bad output can look like)."""

    from zett_agent.model import RetryOptions

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: Any) -> Any:
        from zett_agent.messages import AssistantMessage, ToolCall
        from zett_agent.model import ModelEvent, ModelResponse, Usage

        if not any(m.role == "tool" for m in request.messages):
            message = AssistantMessage(tool_calls=(ToolCall("c1", "look\ud800", {}),))
        else:
            message = AssistantMessage("report \ud800 end")
        yield ModelEvent.completed(ModelResponse(message, Usage(3, 2)))
