"""Every kind of kernel object a sandboxed job could reach, tried for real from inside one.

The host makes objects of its own (``HostObjects.make``: a root-owned 0600 file and a folder
outside the sandbox, with an extended attribute; a System V shared memory segment, message
queue and semaphore set of mode 0600; a POSIX message queue), runs ``probe`` in a sandboxed job
and, once it is done, checks its objects are as they were (``HostObjects.changes``).

``probe`` returns, for each row of the sandbox's table (docs/sandbox.md), each attempt's result:
``"ok"`` or the name of the errno it met. Attempts named ``own ...`` are the legitimate use
next to the denied one and must work.

The module needs only the standard library (a host on another interpreter runs it, and a job
running as uid 65534 imports it from a world-readable copy). Linux on x86_64 or aarch64.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import resource
import signal
import socket
import stat
import time
from collections.abc import Callable
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.shmdt.argtypes = [ctypes.c_void_p]
_libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]

IPC_CREAT = 0o1000
IPC_PRIVATE = 0
IPC_RMID = 0
SHM_INFO = 14
SHM_SIZE = 4096
HOST_TEXT = b"the host's shared memory"
XATTR = "user.zett-host"
XATTR_VALUE = b"set by the host"

#: system calls without a wrapper in libc or Python, by architecture (before the numbering
#: was unified at 424)
_NUMBERS = {
    "x86_64": {
        "add_key": 248,
        "keyctl": 250,
        "kcmp": 312,
        "get_robust_list": 274,
        "migrate_pages": 256,
        "move_pages": 279,
        "ioprio_set": 251,
        "process_vm_readv": 310,
        "process_madvise": 440,
        "setns": 308,
    },
    "aarch64": {
        "add_key": 217,
        "keyctl": 219,
        "kcmp": 272,
        "get_robust_list": 100,
        "migrate_pages": 238,
        "move_pages": 239,
        "ioprio_set": 30,
        "process_vm_readv": 270,
        "process_madvise": 440,
        "setns": 268,
    },
}
_OPEN_TREE = 428
_OPEN_TREE_ATTR = 467
_SETXATTRAT = 463
_AT_EMPTY_PATH = 0x1000
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_DEFAULT = 0
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_SYSLOG_ACTION_READ_ALL = 3


def supported() -> str | None:
    """Why the probes cannot run here, or ``None``."""
    if platform.machine() not in _NUMBERS:
        return f"the probes know the system call numbers of {sorted(_NUMBERS)} only"
    return None


def _number(name: str) -> int:
    return _NUMBERS[platform.machine()][name]


def attempt(action: Callable[[], object]) -> str:
    """``"ok"`` if ``action()`` succeeded, else the name of the errno it failed with."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return "ok"


def _checked(result: int) -> int:
    if result < 0 or result == ctypes.c_void_p(-1).value:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def _syscall(name_or_number: str | int, *args: int | bytes | None) -> int:
    number = _number(name_or_number) if isinstance(name_or_number, str) else name_or_number
    values = [ctypes.c_long(arg) if isinstance(arg, int) else arg for arg in args]
    return _checked(_libc.syscall(ctypes.c_long(number), *values))


# -- the host's objects ------------------------------------------------------------------------


class HostObjects:
    """What the host makes for a job to try to reach, and how to tell whether it did."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.file = os.path.join(folder, "host-file")
        self.directory = os.path.join(folder, "host-dir")
        self.key = 0x5A000000 | (os.getpid() & 0xFFFFFF)
        self.mq_name = f"/zett-host-{os.getpid()}"
        self.shm_id = self.msg_id = self.sem_id = self.mq_fd = -1

    def make(self) -> HostObjects:
        with open(self.file, "w") as handle:
            handle.write("the host's file\n")
        os.chmod(self.file, 0o600)
        os.mkdir(self.directory, 0o700)
        os.setxattr(self.file, XATTR, XATTR_VALUE)
        os.utime(self.file, (1_000_000_000, 1_000_000_000))
        self.shm_id = _checked(_libc.shmget(self.key, SHM_SIZE, IPC_CREAT | 0o600))
        address = _checked(_libc.shmat(self.shm_id, None, 0))
        ctypes.memmove(address, HOST_TEXT, len(HOST_TEXT))
        _libc.shmdt(ctypes.c_void_p(address))
        self.msg_id = _checked(_libc.msgget(self.key, IPC_CREAT | 0o600))
        self.sem_id = _checked(_libc.semget(self.key, 1, IPC_CREAT | 0o600))
        self.mq_fd = _checked(
            _libc.mq_open(self.mq_name.encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
        )
        return self

    def describe(self) -> dict[str, Any]:
        """What the job is told about the host's objects (all it needs to try them)."""
        return {
            "host": os.getpid(),
            "file": self.file,
            "directory": self.directory,
            "key": self.key,
            "shm_id": self.shm_id,
            "mq_name": self.mq_name,
        }

    def state(self) -> dict[str, Any]:
        """What the job must not have changed."""
        st = os.stat(self.file)
        address = _checked(_libc.shmat(self.shm_id, None, 0))
        try:
            text = ctypes.string_at(address, len(HOST_TEXT))
        finally:
            _libc.shmdt(ctypes.c_void_p(address))
        return {
            "file mode": oct(st.st_mode),
            "file owner": [st.st_uid, st.st_gid],
            "file times": [st.st_atime_ns, st.st_mtime_ns],
            "file xattrs": {
                name: os.getxattr(self.file, name).hex() for name in os.listxattr(self.file)
            },
            "directory mode": oct(os.stat(self.directory).st_mode),
            "shared memory": text.decode(errors="replace"),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "affinity": sorted(os.sched_getaffinity(0)),
            "core limit": list(resource.getrlimit(resource.RLIMIT_CORE)),
            "null device mode": oct(os.stat(os.devnull).st_mode),
        }

    def remove(self) -> None:
        if self.shm_id >= 0:
            _libc.shmctl(self.shm_id, IPC_RMID, None)
        if self.msg_id >= 0:
            _libc.msgctl(self.msg_id, IPC_RMID, None)
        if self.sem_id >= 0:
            _libc.semctl(self.sem_id, 0, IPC_RMID)
        if self.mq_fd >= 0:
            os.close(self.mq_fd)
            _libc.mq_unlink(self.mq_name.encode())


# -- inside the job ---------------------------------------------------------------------------


def _own_child() -> int:
    """A child of the job's own that waits to be killed (its pid)."""
    pid = os.fork()
    if pid == 0:
        signal.pause()
        os._exit(0)
    return pid


def _files(host: dict[str, Any]) -> dict[str, str]:
    def own() -> None:
        with open("own-file", "w") as handle:
            handle.write("mine")

    return {
        "read the host's file": attempt(lambda: open(host["file"]).read()),
        "write the host's file": attempt(lambda: open(host["file"], "a").write("x")),
        "make a file in the host's folder": attempt(
            lambda: open(os.path.join(host["directory"], "new"), "w").close()
        ),
        "own scratch file": attempt(own),
    }


def _metadata(host: dict[str, Any]) -> dict[str, str]:
    path, folder = host["file"], host["directory"]
    with open("own-meta", "w") as handle:
        handle.write("mine")
    return {
        "chmod the host's file": attempt(lambda: os.chmod(path, 0o4755)),
        "chmod the host's folder": attempt(lambda: os.chmod(folder, 0o777)),
        "utime the host's file": attempt(lambda: os.utime(path, (0, 0))),
        "setxattr the host's file": attempt(lambda: os.setxattr(path, "user.zett-job", b"x")),
        "removexattr the host's file": attempt(lambda: os.removexattr(path, XATTR)),
        "chown the host's file": attempt(lambda: os.chown(path, os.getuid(), os.getgid())),
        "fchmod an inherited stream": attempt(lambda: os.fchmod(0, 0o666)),
        "futimens an inherited stream": attempt(lambda: os.utime(0, (0, 0))),
        "fsetxattr an inherited stream": attempt(lambda: os.setxattr(2, "user.zett-job", b"x")),
        "setxattrat an inherited stream": attempt(
            lambda: _syscall(_SETXATTRAT, 2, b"", _AT_EMPTY_PATH, b"user.zett-job", None, 0)
        ),
        "own chmod": attempt(lambda: os.chmod("own-meta", 0o750)),
        "own utime": attempt(lambda: os.utime("own-meta", (0, 0))),
        "own setxattr": attempt(lambda: os.setxattr("own-meta", "user.zett-job", b"x")),
    }


def _processes(host: dict[str, Any]) -> dict[str, str]:
    pid = host["host"]
    child = _own_child()
    try:
        seen = {
            "prlimit the host": attempt(
                lambda: resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
            ),
            "read the host's limits": attempt(lambda: resource.prlimit(pid, resource.RLIMIT_CORE)),
            "sched_setaffinity the host": attempt(
                lambda: os.sched_setaffinity(pid, os.sched_getaffinity(0))
            ),
            "sched_setscheduler the host": attempt(
                lambda: os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
            ),
            "setpriority the host": attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 0)),
            "setpriority a process group": attempt(lambda: os.setpriority(os.PRIO_PGRP, 0, 0)),
            "setpriority every process of an account": attempt(
                lambda: os.setpriority(os.PRIO_USER, 0, 0)
            ),
            "ioprio_set the host": attempt(
                lambda: _syscall("ioprio_set", _IOPRIO_WHO_PROCESS, pid, _IOPRIO_DEFAULT)
            ),
            "kill the host": attempt(lambda: os.kill(pid, 0)),
            "pidfd_send_signal the host": attempt(lambda: _pidfd_signal(pid)),
            "process_vm_readv the host": attempt(lambda: _vm_read(pid)),
            "kcmp the host": attempt(lambda: _syscall("kcmp", pid, os.getpid(), 0, 0, 0)),
            "get_robust_list of the host": attempt(lambda: _robust_list(pid)),
            "migrate_pages of the host": attempt(lambda: _migrate(pid)),
            "move_pages of the host": attempt(
                lambda: _syscall("move_pages", pid, 0, None, None, None, 0)
            ),
            "process_madvise the host": attempt(lambda: _madvise(pid)),
            "own setpriority": attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, 1)),
            "own prlimit": attempt(lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))),
            "own sched_setaffinity": attempt(
                lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))
            ),
            "own child: pidfd_send_signal": attempt(lambda: _pidfd_signal(child, signal.SIGKILL)),
        }
    finally:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    return seen


def _pidfd_signal(pid: int, signum: int = 0) -> None:
    fd = os.pidfd_open(pid)
    try:
        signal.pidfd_send_signal(fd, signum)
    finally:
        os.close(fd)


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


def _vm_read(pid: int) -> None:
    buffer = ctypes.create_string_buffer(8)
    local = _IoVec(ctypes.addressof(buffer), 8)
    remote = _IoVec(ctypes.addressof(buffer), 8)
    _syscall("process_vm_readv", pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)


def _robust_list(pid: int) -> None:
    head = ctypes.c_void_p()
    size = ctypes.c_size_t()
    _syscall("get_robust_list", pid, ctypes.addressof(head), ctypes.addressof(size))


def _migrate(pid: int) -> None:
    nodes = ctypes.c_ulong(1)
    _syscall("migrate_pages", pid, 64, ctypes.addressof(nodes), ctypes.addressof(nodes))


def _madvise(pid: int) -> None:
    fd = os.pidfd_open(pid)
    try:
        buffer = ctypes.create_string_buffer(4096)
        vec = _IoVec(ctypes.addressof(buffer), 4096)
        _syscall("process_madvise", fd, ctypes.addressof(vec), 1, 21, 0)  # MADV_COLD
    finally:
        os.close(fd)


def _ipc(host: dict[str, Any]) -> dict[str, Any]:
    key = host["key"]

    def walk() -> int:
        """How many segments the job sees, as ``ipcs`` counts them."""
        info = ctypes.create_string_buffer(256)
        _checked(_libc.shmctl(0, SHM_INFO, info))
        return ctypes.c_int.from_buffer(info).value  # struct shm_info: used_ids first

    def own() -> None:
        segment = _checked(_libc.shmget(IPC_PRIVATE, SHM_SIZE, IPC_CREAT | 0o600))
        try:
            address = _checked(_libc.shmat(segment, None, 0))
            ctypes.memmove(address, b"mine", 4)
            assert ctypes.string_at(address, 4) == b"mine"
            _libc.shmdt(ctypes.c_void_p(address))
        finally:
            _libc.shmctl(segment, IPC_RMID, None)

    return {
        "shmget the host's key": attempt(lambda: _checked(_libc.shmget(key, 0, 0))),
        "shmat the host's segment": attempt(lambda: _checked(_libc.shmat(host["shm_id"], None, 0))),
        "segments a walk sees": _counted(walk),
        "msgget the host's key": attempt(lambda: _checked(_libc.msgget(key, 0))),
        "semget the host's key": attempt(lambda: _checked(_libc.semget(key, 0, 0))),
        "mq_open the host's queue": attempt(
            lambda: os.close(_checked(_libc.mq_open(host["mq_name"].encode(), os.O_RDWR, 0, None)))
        ),
        "own shared memory": attempt(own),
    }


def _counted(count: Callable[[], int]) -> int | str:
    """What ``count()`` returns, or the name of the errno it failed with."""
    try:
        return count()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def _sockets(host: dict[str, Any]) -> dict[str, str]:
    def pair(kind: int) -> None:
        for end in socket.socketpair(socket.AF_UNIX, kind):
            end.close()

    return {
        "TCP socket": attempt(lambda: socket.socket(socket.AF_INET).close()),
        "UDP socket": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()),
        "UNIX socket": attempt(lambda: socket.socket(socket.AF_UNIX).close()),
        "UNIX datagram pair": attempt(lambda: pair(socket.SOCK_DGRAM)),
        "own UNIX stream pair": attempt(lambda: pair(socket.SOCK_STREAM)),
    }


def _keys(host: dict[str, Any]) -> dict[str, str]:
    session, user = -3, -4  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
    return {
        "add_key": attempt(lambda: _syscall("add_key", b"user", b"zett", b"secret", 6, session)),
        "keyctl": attempt(lambda: _syscall("keyctl", 0, user, 0)),  # KEYCTL_GET_KEYRING_ID
    }


def _namespaces(host: dict[str, Any]) -> dict[str, str]:
    return {
        "unshare a mount namespace": attempt(lambda: _checked(_libc.unshare(_CLONE_NEWNS))),
        "unshare a user namespace": attempt(lambda: _checked(_libc.unshare(_CLONE_NEWUSER))),
        "setns": attempt(lambda: _syscall("setns", 0, 0)),
        "mount": attempt(lambda: _checked(_libc.mount(b"none", b".", b"tmpfs", 0, None))),
        "open_tree": attempt(lambda: os.close(_syscall(_OPEN_TREE, -100, b"/", 1))),
        "open_tree_attr": attempt(
            lambda: os.close(_syscall(_OPEN_TREE_ATTR, -100, b"/", 1, None, 0))
        ),
    }


def _devices(host: dict[str, Any]) -> dict[str, str]:
    return {
        "read a disk": attempt(lambda: os.close(os.open(_a_disk(), os.O_RDONLY))),
        "make a device node": attempt(
            lambda: os.mknod("own-device", stat.S_IFCHR | 0o600, os.makedev(1, 1))
        ),
        "own write to /dev/null": attempt(lambda: open(os.devnull, "w").write("x")),
    }


def _a_disk() -> str:
    for name in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda", "/dev/loop0"):
        if os.path.exists(name):
            return name
    return "/dev/vda"


class _TimeVal(ctypes.Structure):
    _fields_ = (("sec", ctypes.c_long), ("usec", ctypes.c_long))


def _time(host: dict[str, Any]) -> dict[str, str]:
    def set_day() -> None:
        now = time.time()  # a success would set the clock to what it reads (a test to fail)
        value = _TimeVal(int(now), int(now % 1 * 1e6))
        _checked(_libc.settimeofday(ctypes.byref(value), None))

    return {
        "clock_settime": attempt(
            lambda: time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME))
        ),
        "settimeofday": attempt(set_day),
        "own clock": attempt(lambda: time.clock_gettime(time.CLOCK_MONOTONIC)),
    }


def _resources(host: dict[str, Any]) -> dict[str, str]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def write(path: str, text: str) -> None:
        with open(path, "w") as handle:
            handle.write(text)

    return {
        "raise a hard limit": attempt(lambda: _raise_hard_limit(soft, hard)),
        "move into another cgroup": attempt(
            lambda: write(_cgroup_root() + "/cgroup.procs", str(os.getpid()))
        ),
        "read the kernel log": attempt(
            lambda: _checked(
                _libc.klogctl(_SYSLOG_ACTION_READ_ALL, ctypes.create_string_buffer(64), 64)
            )
        ),
        "own lower limit": attempt(
            lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))
        ),
    }


def _raise_hard_limit(soft: int, hard: int) -> None:
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard + 1))
    except ValueError as exc:  # what Python makes of the kernel's EPERM here
        raise PermissionError(errno.EPERM, str(exc)) from None


def _cgroup_root() -> str:
    return "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"


def _account(host: dict[str, Any]) -> dict[str, Any]:
    return {"ids": [list(os.getresuid()), list(os.getresgid()), os.getgroups()]}


ROWS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "files": _files,
    "file metadata": _metadata,
    "other processes": _processes,
    "IPC": _ipc,
    "sockets": _sockets,
    "keys": _keys,
    "namespaces and mounts": _namespaces,
    "devices": _devices,
    "time": _time,
    "resources and the kernel log": _resources,
    "account": _account,
}


def probe(host: dict[str, Any]) -> dict[str, Any]:
    """Run every row's attempts from inside the job; ``{row: {attempt: result}}``."""
    return {row: run(host) for row, run in ROWS.items()}


def main(argv: list[str]) -> None:
    """The host: ``main([_, SRC, USER, FOLDER])`` prints the probes and the checks as JSON.

    ``SRC`` holds ``zett_agent``; ``USER`` is the ``Sandbox(user=...)`` uid, or empty for the
    default; ``FOLDER`` is where the host's file and folder are made.
    """
    import asyncio
    import sys

    sys.path.insert(0, argv[1])
    from zett_agent.process import ProcessPool, Sandbox

    sandbox = Sandbox(user=int(argv[2])) if argv[2] else Sandbox()
    objects = HostObjects(argv[3]).make()
    try:
        before = objects.state()

        async def run() -> tuple[Any, Any]:
            async with ProcessPool(1) as pool:
                job = pool.submit(probe, objects.describe(), sandbox=sandbox)
                return await job, job.sandbox_report

        seen, report = asyncio.run(run())
        after = objects.state()
    finally:
        objects.remove()
    changed = {key: [before[key], after[key]] for key in before if before[key] != after[key]}
    print(
        json.dumps(
            {
                "host": {"ids": [list(os.getresuid()), list(os.getresgid()), os.getgroups()]},
                "seen": seen,
                "report": report,
                "changed": changed,
            }
        )
    )


if __name__ == "__main__":
    import sys

    main(sys.argv)  # python _kernel_objects.py SRC USER FOLDER
