"""Jobs that try to reach past their sandbox, or past their worker's Landlock domain.

Each attempt is made for real and reported as ``"ok"`` or the error it met (``"EPERM"``,
``"EACCES"``...), so a test asserts both the denial and that the legitimate use next to it
worked. The module is importable (the pool's launcher inherits ``sys.path``, on which pytest put
this directory), so a sandboxed worker imports it from a path its sandbox may read.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _reliability_children import channel_fd, frame

from support.children import escape_then_wait
from zett_agent.process import emit

_PTRACE_SEIZE = 0x4206
_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.restype = ctypes.c_ssize_t


def attempt(action: Callable[[], object]) -> str:
    """``"ok"`` if ``action()`` succeeded, else the name of the errno it failed with."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return "ok"


def _libc_call(result: int) -> None:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def ptrace_seize(pid: int) -> None:
    """Attach without stopping the target (a success leaves it running; our exit detaches)."""
    _libc_call(_libc.ptrace(_PTRACE_SEIZE, pid, 0, 0))


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


def process_vm_readv(pid: int) -> None:
    """Read 8 bytes of ``pid``'s memory (at the address of a buffer of ours: in another
    process it may be unmapped, and ``EFAULT`` means the read itself was allowed)."""
    source = ctypes.create_string_buffer(b"zett", 8)
    target = ctypes.create_string_buffer(8)
    local = _IoVec(ctypes.addressof(target), 8)
    remote = _IoVec(ctypes.addressof(source), 8)
    result = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if result < 0 and ctypes.get_errno() != errno.EFAULT:
        _libc_call(result)


def tiocsti(request: int) -> None:
    """``ioctl(stdout, TIOCSTI, "x")``: push a character into the terminal's input queue."""
    char = ctypes.c_char(b"x")
    _libc_call(_libc.ioctl(1, ctypes.c_ulong(request), ctypes.byref(char)))


def read_file(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def write_file(path: str, text: str = "x") -> None:
    with open(path, "w") as handle:
        handle.write(text)


def connect_abstract(name: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(b"\0" + name)


def own_abstract_socket() -> None:
    """Listen on an abstract socket of our own and connect to it: inside the domain."""
    name = b"\0zett-own-" + os.urandom(6).hex().encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(name)
        server.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(name)


def signal_own_child() -> None:
    """Start a child, SIGTERM it and reap it: a job controls its own processes."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    os.kill(child.pid, signal.SIGTERM)
    if child.wait(timeout=10) != -signal.SIGTERM:
        raise OSError(errno.EINVAL, "the child was not killed by our SIGTERM")


# ---------------------------------------------------------------- against the supervisors


def attack_supervisors(host: int, abstract: bytes) -> dict[str, str]:
    """Everything a job could do to its launcher and its host, and the legitimate uses beside
    it (signal 0 only, towards the host: a success must not harm the test process)."""
    launcher = os.getppid()
    pidfd = os.pidfd_open(host)
    try:
        return {
            "stop launcher": attempt(lambda: os.kill(launcher, signal.SIGSTOP)),
            "kill launcher": attempt(lambda: os.kill(launcher, signal.SIGKILL)),
            "signal host": attempt(lambda: os.kill(host, 0)),
            "pidfd host": attempt(lambda: signal.pidfd_send_signal(pidfd, 0)),
            "ptrace host": attempt(lambda: ptrace_seize(host)),
            "ptrace launcher": attempt(lambda: ptrace_seize(launcher)),
            "vm_readv host": attempt(lambda: process_vm_readv(host)),
            "mem host": attempt(lambda: read_file(f"/proc/{host}/mem")),
            "abstract socket": attempt(lambda: connect_abstract(abstract)),
            "own child": attempt(signal_own_child),
            "own abstract socket": attempt(own_abstract_socket),
            "own memory": attempt(lambda: process_vm_readv(os.getpid())),
        }
    finally:
        os.close(pidfd)


def signal_launcher_with_0() -> str:
    return attempt(lambda: os.kill(os.getppid(), 0))


def nested_pool_kills_its_trees() -> dict[str, Any]:
    """A pool inside this job (as a child agent with children of its own): its job starts a
    setsid grandchild; cancelling it kills the whole tree; what the inner pool reports."""
    import asyncio

    from zett_agent.process import ProcessPool

    async def main() -> dict[str, Any]:
        async with ProcessPool(1, spare_workers=0) as pool:
            job = pool.submit(escape_then_wait)
            pids: list[int] = []
            async for pids in job.events():  # noqa: B007 - the first event is the pids
                break
            alive_before = [_alive(pid) for pid in pids]
            await job.cancel()
            for _ in range(500):
                if not any(_alive(pid) for pid in pids):
                    break
                await asyncio.sleep(0.01)
            return {
                "alive before": alive_before,
                "alive after": [_alive(pid) for pid in pids],
                "inner": pool.containment_info,
            }

    return asyncio.run(main())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


# ---------------------------------------------------------------- inside a sandbox


def sandbox_probe(
    host: int, secret: str, outside: str, readable: str, abstract: bytes, procs: list[str]
) -> dict[str, Any]:
    """Try each way out of a sandbox, and the legitimate use beside each; ``procs`` are
    ``cgroup.procs`` files to write our pid into (leaving our cgroup)."""
    pid = str(os.getpid())
    return {
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "read secret": attempt(lambda: read_file(secret)),
        "read allowed": attempt(lambda: read_file(readable)),
        "write outside": attempt(lambda: write_file(outside)),
        "write scratch": attempt(lambda: write_file("inside.txt")),
        "write tmpdir": attempt(lambda: write_file(os.path.join(os.environ["TMPDIR"], "t"))),
        "signal host": attempt(lambda: os.kill(host, 0)),
        "signal launcher": attempt(lambda: os.kill(os.getppid(), 0)),
        "ptrace host": attempt(lambda: ptrace_seize(host)),
        "vm_readv host": attempt(lambda: process_vm_readv(host)),
        "environ host": attempt(lambda: read_file(f"/proc/{host}/environ")),
        "cgroup.procs": [attempt(lambda path=path: write_file(path, pid)) for path in procs],
        "abstract socket": attempt(lambda: connect_abstract(abstract)),
        "own child": attempt(signal_own_child),
        "own abstract socket": attempt(own_abstract_socket),
        "socketpair": attempt(socket.socketpair),
        "push terminal input": [
            attempt(lambda r=r: tiocsti(r)) for r in (0x5412, 1 << 32 | 0x5412)
        ],
        "new unix socket": attempt(lambda: socket.socket(socket.AF_UNIX).close()),
    }


def network(host: str, tcp_port: int, udp_port: int) -> dict[str, str]:
    def tcp() -> None:
        with socket.create_connection((host, tcp_port), timeout=5) as sock:
            sock.sendall(b"tcp from the job")

    def udp() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"udp from the job", (host, udp_port))

    return {"tcp": attempt(tcp), "udp": attempt(udp)}


def marker_job(path: str) -> str:
    write_file(path, "ran")
    return "ran"


def grandchild_probe(secret: str, host: int) -> None:
    """Start a grandchild that tries the same ways out, report what it met and its pid, and
    wait (with it) to be cancelled."""
    code = (
        "import os, sys, json\n"
        "def attempt(f):\n"
        "    try:\n        f()\n    except OSError as e:\n        return e.errno\n"
        "    return 'ok'\n"
        "def read():\n    open(sys.argv[1]).read()\n"
        "def write():\n    open('/tmp/zett-grandchild-was-here', 'w').write('x')\n"
        "print(json.dumps({'read secret': attempt(read), 'write outside': attempt(write),"
        " 'signal host': attempt(lambda: os.kill(int(sys.argv[2]), 0)),"
        " 'uid': os.getuid()}), flush=True)\n"
        "import time\nwhile True:\n    time.sleep(1)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, secret, str(host)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    report = child.stdout.readline()
    emit({"pids": [os.getpid(), child.pid], "grandchild": report})
    while True:
        time.sleep(1)


def wait_with_pid(path: str) -> dict[str, str]:
    """Report our pid, wait for a line on the FIFO at ``path``, return our environment."""
    emit(os.getpid())
    with open(path) as stream:
        stream.readline()
    return dict(os.environ)


class Planted:
    """An argument whose unpickling writes a file: code of the job that runs at load time."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (write_file, (self.path, "written while unpickling"))


def forge_a_sandbox_report() -> None:
    """Write a sandbox report of our own into the channel, as if the worker had sent it."""
    os.write(channel_fd(), frame(b'{"k":"sandbox","v":{"landlock_abi":99}}'))
    emit("sent")


def _ruleset_fds() -> int:
    """How many Landlock rulesets this process holds open."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if "landlock-ruleset" in os.readlink(f"/proc/self/fd/{name}"):
                count += 1
        except OSError:
            pass
    return count


def _shared_part(network: str) -> str:
    from zett_agent.process import Sandbox
    from zett_agent.process._sandbox import _options as _sandbox
    from zett_agent.process._sandbox import _policy

    account = _sandbox.resolve_account(None)
    return _policy.shared_part(Sandbox(network=network), account, landlock_abi=99, seccomp=True)


def prepare_as_a_spare(network: str) -> int:
    """Prepare what a spare of a pool sandboxing jobs of ``network``'s kind prepares; return
    how many rulesets this worker then holds."""
    from zett_agent.process._sandbox import _ruleset

    _ruleset.prepare(_shared_part(network))
    return _ruleset_fds()


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def rulesets_held() -> int:
    return _ruleset_fds()


def confine_after_preparing(
    prepared: str, network_: str, scratch: str, host: str, tcp_port: int, udp_port: int
) -> dict[str, Any]:
    """Prepare for jobs of ``prepared``'s network kind, as a spare does, then confine this
    worker for a job of ``network_``'s, as a sandboxed job's worker does, and try the network."""
    import json

    from zett_agent.process import Sandbox
    from zett_agent.process._child._worker import current_channel
    from zett_agent.process._sandbox import _confine, _policy, _ruleset

    channel = current_channel()
    assert channel is not None
    _ruleset.prepare(_shared_part(prepared))
    shared = _shared_part(network_)
    parts = json.loads(_policy.policy(Sandbox(network=network_), scratch, shared))
    report = _confine.confine({**parts["shared"], **parts["job"]}, channel.sock.fileno())
    return {
        "refused": report.get("refused"),
        "prepared": report.get("prepared"),
        # /proc is out of reach now: what is open, beyond stdio and the channel
        "fds left": [fd for fd in range(3, 1024) if fd != channel.sock.fileno() and _open(fd)],
        **network(host, tcp_port, udp_port),
    }
