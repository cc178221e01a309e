"""Offline models, tools and engine jobs shipped to child processes by the reliability tests.

They live in an importable module (not in the test files) so child processes load them cheaply;
the pool's launcher inherits ``sys.path``, on which pytest put this directory.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from zett_agent.messages import AssistantMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions
from zett_agent.process import emit
from zett_agent.process._wire._protocol import HEADER
from zett_agent.tools import AgentTool

# ------------------------------------------------------------------ hostile child-side code


class MakeDirOnLoad:
    """Unpickling this object calls ``os.mkdir(path)``: the marker proves code ran on load."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def malicious_pickle(marker: str) -> bytes:
    return pickle.dumps(MakeDirOnLoad(marker))


def channel_fd() -> int:
    from zett_agent.process._child._worker import _channel_fd

    return _channel_fd()


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def write_pickle_frame(marker: str) -> None:
    """Send a pickle (that would create ``marker`` when loaded) as if it were a result frame."""
    emit(os.getpid())
    os.write(channel_fd(), frame(malicious_pickle(marker)))
    time.sleep(600)


def lying_length(claimed: int, payload: bytes, then: str) -> None:
    """Emit our pid, write a header that lies about the frame's size, then sleep or exit."""
    emit(os.getpid())
    os.write(channel_fd(), HEADER.pack(claimed) + payload)
    if then == "exit":
        os._exit(0)
    time.sleep(600)


def huge_raw_report(announced: int, chunk: int) -> None:
    """Announce a frame bigger than the cap and keep writing its body until killed."""
    fd = channel_fd()
    os.write(fd, HEADER.pack(announced))
    data = b"A" * chunk
    while True:
        os.write(fd, data)


def huge_result(nbytes: int) -> str:
    return "R" * nbytes


def close_channel_and_keep_running() -> None:
    """Tell the parent our pid, close the result channel, then live on."""
    emit(os.getpid())
    os.close(channel_fd())
    while True:
        time.sleep(1)


def fork_bomb(limit: int) -> None:
    """Every process forks as fast as it can until ``limit`` forks happened; report all pids.

    The budget is a pipe holding ``limit`` tokens: each fork costs one, so the tree (wide and
    deep, like a real fork bomb) stops at exactly ``limit`` processes.
    """
    tokens_r, tokens_w = os.pipe()
    os.write(tokens_w, b"t" * limit)
    os.close(tokens_w)  # once the tokens are gone, read() returns b"": the bomb stops
    report_r, report_w = os.pipe()
    me = os.getpid()
    while os.read(tokens_r, 1):
        if os.fork() == 0:
            os.write(report_w, f"{os.getpid()}\n".encode())
    if os.getpid() != me:
        while True:
            signal.pause()
    pids: list[int] = []
    buffer = b""
    while len(pids) < limit:
        buffer += os.read(report_r, 4096)
        *lines, buffer = buffer.split(b"\n")
        pids += [int(line) for line in lines]
    emit(pids)
    while True:
        time.sleep(1)


def ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "print(flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    child.stdout.readline()  # the grandchild ignores SIGTERM too
    emit([os.getpid(), child.pid])
    while True:
        time.sleep(1)


def beacon(path: str, text: str) -> None:
    """Send one datagram to the test's socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(text.encode(), path)


# ------------------------------------------------------------------ hostile child-agent tools


def _pickle_into_channel(marker: str) -> str:
    write_pickle_frame(marker)
    return "unreachable"


PICKLE_TOOL = AgentTool(
    "pickle_bomb",
    "Write a pickle into the result channel.",
    {"type": "object", "properties": {"marker": {"type": "string"}}},
    _pickle_into_channel,
)


def endless_events(size: int, counter_path: str) -> None:
    """Emit events of ``size`` characters forever; keep the count sent so far in a file."""
    fd = os.open(counter_path, os.O_WRONLY | os.O_CREAT, 0o600)
    blob = "x" * size
    sent = 0
    while True:
        emit({"n": sent, "blob": blob})
        sent += 1
        os.pwrite(fd, b"%12d" % sent, 0)


def announce_text_then(size: int, raw: bytes) -> None:
    """Announce a streamed result that is a text of ``size`` bytes, then send ``raw`` as its
    text frame."""
    begin = b'{"k":"begin","m":"result"}'
    announce = b'{"k":"text","n":%d,"c":%d,"w":1,"a":false}' % (size, size)
    os.write(channel_fd(), frame(begin) + frame(announce) + frame(raw))
    time.sleep(600)


def return_protocol0_pickle(marker: str, pad: int) -> str:
    """A well-formed result whose text *is* an ASCII pickle (protocol 0) of the payload.

    ``pad`` spaces make it long enough to travel as a raw text frame.
    """
    return pickle.dumps(MakeDirOnLoad(marker), protocol=0).decode("ascii") + " " * pad


def emit_pickle_then_return(marker: str) -> str:
    emit(pickle.dumps(MakeDirOnLoad(marker), protocol=0).decode("ascii"))
    return "done"


# ------------------------------------------------------------------- cgroup structure attacks


def own_cgroup_dir() -> str:
    """The directory of the cgroup v2 this process is in (its worker's, under cgroup
    containment; the host's under scan containment)."""
    with open("/proc/self/cgroup") as handle:
        relative = next(line[3:].strip() for line in handle if line.startswith("0::"))
    mounts = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            before, _, after = line.partition(" - ")
            if after.split(" ", 1)[0] == "cgroup2":
                mounts.append(before.split(" ")[4])
    preferred = [m for m in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified") if m in mounts]
    mount = (preferred or mounts)[0]
    return os.path.normpath(f"{mount}/{relative.lstrip('/')}")


def build_cgroups(shape: str, count: int, top: str) -> None:
    """Build cgroups below this job's own cgroup, as many as it may up to ``count``: a chain
    (``deep``) or siblings (``wide``) under a cgroup named ``top``; emit what it made, then
    wait to be killed."""
    base = os.path.join(own_cgroup_dir(), top)
    made, error = 0, None
    try:
        os.mkdir(base)
        made = 1
        path = base
        for index in range(count - 1):
            path = os.path.join(path, "d") if shape == "deep" else os.path.join(base, f"w{index}")
            os.mkdir(path)
            made += 1
    except OSError as exc:
        error = exc.errno
    emit({"made": made, "errno": error, "base": base})
    while True:
        time.sleep(1000)


def hide_orphan(hide: bool) -> str:
    """Leave an orphan behind and return ``"<pid> <where>"``: the worker's subreaper flag is
    switched off first (so the orphan is reparented out of the worker, to the launcher), and
    with ``hide`` the orphan moves itself into a cgroup made below its worker's cgroup, out of
    the worker cgroup's own process list."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            where = "in place"
            if hide:
                try:
                    cgroup = os.path.join(own_cgroup_dir(), "hide")
                    os.mkdir(cgroup)
                    with open(f"{cgroup}/cgroup.procs", "w") as procs:
                        procs.write("0")
                    where = "hidden"
                except OSError as exc:
                    where = f"not hidden ({exc})"
            os.write(write_end, f"{os.getpid()} {where}\n".encode())
            while True:
                time.sleep(1000)
        os._exit(0)
    os.close(write_end)
    os.waitpid(middle, 0)
    with os.fdopen(read_end) as stream:
        return stream.readline().strip()


# ------------------------------------------------------------- children that end at any moment


class EndsSoon:
    """A child that answers, crashes or leaves a ``setsid`` grandchild after a random moment
    of up to 50 ms (``how``: ``"answer"``, ``"crash"``, ``"spawn"``)."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, how: str) -> None:
        self.how = how

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        import ctypes
        import random

        if self.how == "spawn":
            subprocess.Popen(["sleep", "600"], start_new_session=True)  # noqa: ASYNC220
        await asyncio.sleep(random.random() * 0.05)
        if self.how == "crash":
            ctypes.string_at(0)
        yield ModelEvent.completed(ModelResponse(AssistantMessage(f"{self.how}: done")))
