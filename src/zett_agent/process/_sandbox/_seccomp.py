"""A seccomp filter for sandboxed jobs, built with libseccomp through ctypes.

Everything is allowed except what lets a process reach past its sandbox, which fails with
``EPERM`` (not a kill, so a denied call is a clear ``PermissionError`` in the job):

- other processes' memory and execution: ``ptrace``, ``process_vm_readv``/``writev``,
  ``pidfd_getfd``;
- kernel attack surface a job does not need: ``io_uring_*`` (which also performs socket and
  file operations out of this filter's sight), ``bpf``, ``perf_event_open``, ``userfaultfd``,
  the keyring (``add_key``, ``request_key``, ``keyctl``);
- the file system namespace: ``mount``, ``umount2``, ``pivot_root``, the new mount API
  (``move_mount``, ``open_tree``, ``fsopen``, ``fsmount``, ``fsconfig``, ``fspick``,
  ``mount_setattr``), ``open_by_handle_at`` (opens a file by handle, past path-based rules);
- namespaces: ``setns``, and ``unshare`` and ``clone`` with any ``CLONE_NEW*`` flag. ``clone3``
  takes its flags in a struct, which seccomp cannot read, so it fails with ``ENOSYS``: libc then
  falls back to ``clone``, whose flags are an argument;
- the machine: module loading, ``kexec_load``/``kexec_file_load``, ``reboot``, ``swapon``/
  ``swapoff``, ``acct``;
- the terminal it inherited: ``ioctl`` ``TIOCSTI`` (pushing input into the host's terminal, run
  by its shell later) and ``TIOCLINUX`` (the same on a virtual console). Landlock's ioctl rights
  cover only files opened inside the sandbox, not the stdout and stderr a job inherits;
- other processes by pid (``prlimit64``, ``sched_setaffinity``/``setscheduler``/``setparam``/
  ``setattr``, ``migrate_pages``, ``move_pages``, ``get_robust_list``): only the calling process
  itself (pid 0) may be named; ``setpriority`` and ``ioprio_set`` only for the calling process
  (not a process group, not every process of an account); ``kcmp``, ``process_madvise``,
  ``process_mrelease`` not at all. Signals and ``ptrace`` access to processes outside the job
  are Landlock's (scoping); ``pidfd_open`` stays (asyncio and a pool inside the job need it),
  and what a pidfd of an outside process could do is each denied here or by Landlock;
- file metadata through a descriptor (``fchmod``, ``fchown``, ``fsetxattr``, ``fremovexattr``,
  and the ``*at`` calls on the descriptor itself: ``utimensat``/``futimesat`` without a path,
  ``AT_EMPTY_PATH``): a descriptor the job inherited (its standard streams) points into the
  host's mounts, past the job's read-only view (``_view``); by path, metadata calls meet that
  view. Where the view could not be made (``view=False``), every metadata call (the ``chmod``,
  ``chown``, ``utime`` and ``*xattr`` families) and every System V IPC and POSIX message queue
  call is denied instead;
- the kernel log (``syslog``);
- with ``network="none"``: creating any socket (``socket``, every family: a pathname UNIX socket
  such as a container daemon's is a way out of the sandbox, and Landlock controls connecting to
  one only from ABI 9 on), and ``socketpair`` except for connected ``AF_UNIX`` stream and
  seqpacket pairs (asyncio's event loop needs one; a datagram pair could ``sendto`` any path);
- with ``Egress`` (``network="egress"``): sockets of every family but IPv4 and IPv6 (which reach
  only the job's own loopback, in its network namespace), and the same ``socketpair`` rule;
- system calls newer than this filter was written for (a number above ``REVIEWED``, on x86_64
  and aarch64) fail with ``ENOSYS``, as on a kernel that lacks them: a call added later is never
  allowed unseen. Calls libseccomp is too old to name but this filter reviewed are ruled by
  number (from 424 on, every architecture shares the numbers).

System calls are resolved by name, so the filter is right on every architecture libseccomp
knows; calls of another architecture (32-bit ``int 0x80`` on x86_64) kill the process, as
libseccomp does by default. The filter is compiled once per process (as a binary tree of the
system call numbers) and kept as BPF, so loading it in a worker is one ``prctl``
(the host compiles it and sends it with the job: a worker never loads libseccomp).

Imported by the launcher and the workers, so it imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import struct

__all__ = ["REVIEWED", "available", "install", "load", "prepare", "program"]

_SCMP_ACT_ALLOW = 0x7FFF0000
#: ``SCMP_FLTATR_CTL_OPTIMIZE``: 2 sorts the system calls into a binary tree (libseccomp 2.5)
_SCMP_FLTATR_CTL_OPTIMIZE = 8
_OPTIMIZE_BINARY_TREE = 2
_SCMP_CMP_NE = 1
_SCMP_CMP_MASKED_EQ = 7
_PR_GET_SECCOMP = 21
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
#: the kernel reads an ioctl's request as 32 bits: compare those only, or high bits get past
_IOCTL_MASK = 0xFFFFFFFF
_AF_UNIX = 1
_SOCK_DGRAM = 2
_SOCK_TYPE_MASK = 0xF
_SCMP_CMP_LT = 2
_SCMP_CMP_EQ = 4
_SCMP_CMP_GT = 6
_AF_INET = 2
_AF_INET6 = 10
_AT_EMPTY_PATH = 0x1000
_PRIO_PROCESS = 0
_IOPRIO_WHO_PROCESS = 1

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_NAMESPACE_FLAGS = (
    _CLONE_NEWNS,
    _CLONE_NEWCGROUP,
    _CLONE_NEWUTS,
    _CLONE_NEWIPC,
    _CLONE_NEWUSER,
    _CLONE_NEWPID,
    _CLONE_NEWNET,
)

#: denied with EPERM whatever their arguments
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "add_key",
    "request_key",
    "keyctl",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "open_by_handle_at",
    "setns",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "kcmp",
    "process_madvise",
    "process_mrelease",
    "syslog",
    "fchmod",
    "fchown",
    "fsetxattr",
    "fremovexattr",
)

#: calls that act on a process by pid (argument 0): allowed for pid 0 (the caller) only
SELF_ONLY = (
    "prlimit64",
    "sched_setaffinity",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "migrate_pages",
    "move_pages",
    "get_robust_list",
)

#: calls that act on the file a descriptor names when their ``AT_EMPTY_PATH`` flag is set:
#: name -> the argument that holds the flags
EMPTY_PATH_FLAGS = {
    "utimensat": 3,
    "fchmodat2": 3,
    "fchownat": 4,
    "setxattrat": 2,
    "removexattrat": 2,
    "file_setattr": 4,
}

#: with no view (``view=False``): every call that changes a file's metadata by path, and
#: System V IPC and POSIX message queues (the host's, without an IPC namespace of the job's)
WITHOUT_VIEW = (
    "chmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "lchown",
    "fchownat",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "setxattr",
    "lsetxattr",
    "setxattrat",
    "removexattr",
    "lremovexattr",
    "removexattrat",
    "file_setattr",
    "shmget",
    "shmat",
    "shmctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
)

#: calls newer than libseccomp 2.5 names, by number (the same on every architecture: they
#: came after the numbering was unified at 424)
_BY_NUMBER = {
    "setxattrat": 463,
    "removexattrat": 466,
    "open_tree_attr": 467,
    "file_setattr": 469,
}
#: the highest system call number this filter was written for (``file_setattr``, Linux 6.17);
#: a higher one fails with ENOSYS
REVIEWED = 469
#: ``AUDIT_ARCH_*`` of the architectures whose numbers ``REVIEWED`` counts in
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _action_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


class _SockFprog(ctypes.Structure):
    # c_char_p, not a buffer: the struct points at the program's bytes object itself (kept
    # alive in the struct's _objects), which the kernel only reads. A buffer of the program's
    # length made a new ctypes array type in each worker: a tenth of a millisecond.
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))


_lib: ctypes.CDLL | None = None
_lib_problem: str | None = None
_lib_tried = False


def _library() -> ctypes.CDLL | None:
    """libseccomp, loaded on first use.

    A worker only loads a filter the host compiled, and never needs the library.
    """
    global _lib, _lib_problem, _lib_tried
    if _lib_tried:
        return _lib
    _lib_tried = True
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        _lib_problem = (
            "libseccomp.so.2 is not installed (install the libseccomp2 package, or libseccomp "
            "on Fedora and Arch)"
        )
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    _lib = lib
    return lib


_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int

_programs: dict[tuple[str, bool, int], bytes] = {}
_kernel_problem: str | bool | None = False  # False: not looked at yet


def available() -> tuple[bool, str | None]:
    """``(True, None)`` when a filter can be loaded here, else ``(False, why not)``."""
    global _kernel_problem
    if _library() is None:
        return False, _lib_problem
    if _kernel_problem is False:
        if _prctl(_PR_GET_SECCOMP, 0, None, 0, 0) < 0:
            _kernel_problem = (
                "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER=y is needed)"
            )
        else:
            _kernel_problem = None
    return _kernel_problem is None, _kernel_problem if isinstance(_kernel_problem, str) else None


def _clone_flags_arg() -> int:
    # clone(flags, stack, ...) on almost every architecture; s390 swaps the first two
    return 1 if os.uname().machine.startswith("s390") else 0


def program(network: str = "none", view: bool = True, reviewed: int = REVIEWED) -> bytes:
    """The filter as raw BPF (``struct sock_filter`` array), compiled once per process.

    ``network`` is the sandbox's kind: ``"none"``, ``"all"`` or ``"egress"``. ``view``: the
    job has its own read-only view and IPC namespace (``_view``); without one the calls that
    view would have stopped are denied (``WITHOUT_VIEW``). ``reviewed``: the
    highest system call number allowed unseen (the tests lower it to watch the bound work).
    Raises ``OSError`` when libseccomp is missing or refuses a rule.
    """
    if network not in ("none", "all", "egress"):
        raise ValueError(f"no such network kind: {network!r:.40}")
    key = (network, view, reviewed)
    cached = _programs.get(key)
    if cached is not None:
        return cached
    lib = _library()
    if lib is None:
        raise OSError(_errno.ENOSYS, _lib_problem)
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError(_errno.ENOMEM, "seccomp_init failed")
    eperm = _action_errno(_errno.EPERM)
    # The same decisions in a shorter program: loading it, the kernel runs the filter once per
    # system call number of each architecture to find the calls it can allow without running
    # it again; a binary tree instead of a list makes that a fifth faster (a sandboxed job's
    # worker loads it on the job's start). An older libseccomp refuses the attribute: the list.
    lib.seccomp_attr_set(ctx, _SCMP_FLTATR_CTL_OPTIMIZE, _OPTIMIZE_BINARY_TREE)

    def rule(name: str, action: int, *compare: tuple[int, int, int, int]) -> None:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:
            number = _BY_NUMBER.get(name, -1)
        if number < 0:
            return  # no such call on this architecture: nothing to deny
        array = (_ArgCmp * max(1, len(compare)))(*(_ArgCmp(*c) for c in compare))
        code = lib.seccomp_rule_add_array(ctx, action, number, len(compare), array)
        if code < 0:
            raise OSError(-code, f"seccomp_rule_add({name}): {os.strerror(-code)}")

    try:
        for name in DENIED:
            rule(name, eperm)
        rule("clone3", _action_errno(_errno.ENOSYS))
        for request in (_TIOCSTI, _TIOCLINUX):
            rule("ioctl", eperm, (1, _SCMP_CMP_MASKED_EQ, _IOCTL_MASK, request))
        flags_arg = _clone_flags_arg()
        for flag in _NAMESPACE_FLAGS:
            rule("clone", eperm, (flags_arg, _SCMP_CMP_MASKED_EQ, flag, flag))
            rule("unshare", eperm, (0, _SCMP_CMP_MASKED_EQ, flag, flag))
        for name in SELF_ONLY:
            rule(name, eperm, (0, _SCMP_CMP_NE, 0, 0))
        for name, which in (("setpriority", _PRIO_PROCESS), ("ioprio_set", _IOPRIO_WHO_PROCESS)):
            rule(name, eperm, (0, _SCMP_CMP_NE, which, 0))
            rule(name, eperm, (1, _SCMP_CMP_NE, 0, 0))
        if view:
            for name, arg in EMPTY_PATH_FLAGS.items():
                rule(name, eperm, (arg, _SCMP_CMP_MASKED_EQ, _AT_EMPTY_PATH, _AT_EMPTY_PATH))
            for name in ("utimensat", "futimesat"):  # no path: the descriptor's own file
                rule(name, eperm, (1, _SCMP_CMP_EQ, 0, 0))
        else:
            for name in WITHOUT_VIEW:
                rule(name, eperm)
        if network == "none":
            rule("socket", eperm)
        elif network == "egress":
            # IPv4 and IPv6 only (in the job's namespace they reach its loopback alone): no
            # pathname UNIX socket (a daemon's is a way out), no netlink, no packet socket
            rule("socket", eperm, (0, _SCMP_CMP_LT, _AF_INET, 0))
            rule("socket", eperm, (0, _SCMP_CMP_GT, _AF_INET6, 0))
            for family in range(_AF_INET + 1, _AF_INET6):
                rule("socket", eperm, (0, _SCMP_CMP_EQ, family, 0))
        if network != "all":
            rule("socketpair", eperm, (0, _SCMP_CMP_NE, _AF_UNIX, 0))
            rule("socketpair", eperm, (1, _SCMP_CMP_MASKED_EQ, _SOCK_TYPE_MASK, _SOCK_DGRAM))
        fd = os.memfd_create("zett-agent-seccomp", os.MFD_CLOEXEC)
        try:
            code = lib.seccomp_export_bpf(ctx, fd)
            if code < 0:
                raise OSError(-code, f"seccomp_export_bpf: {os.strerror(-code)}")
            size = os.lseek(fd, 0, os.SEEK_CUR)
            data = os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if not data or len(data) % 8:
        raise OSError(_errno.EINVAL, "libseccomp exported a malformed filter")
    data = _newer_calls_guard(reviewed) + data
    _programs[key] = data
    return data


def _newer_calls_guard(reviewed: int) -> bytes:
    """BPF run before libseccomp's program: a call numbered above ``reviewed`` gets ENOSYS.

    Only on an architecture whose numbers ``REVIEWED`` counts (``_AUDIT_ARCH``); elsewhere
    nothing (libseccomp's program alone). Its jumps are relative, so putting these five
    instructions in front leaves libseccomp's own intact.
    """
    arch = _AUDIT_ARCH.get(os.uname().machine)
    if arch is None:
        return b""
    load, jeq, jgt, ret = 0x20, 0x15, 0x25, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGT|K, RET|K
    pack = struct.Struct("=HBBI").pack  # struct sock_filter: code, jt, jf, k
    return b"".join(
        (
            pack(load, 0, 0, 4),  # seccomp_data.arch
            pack(jeq, 0, 3, arch),  # another architecture: on to libseccomp's program
            pack(load, 0, 0, 0),  # seccomp_data.nr
            pack(jgt, 0, 1, reviewed),
            pack(ret, 0, 0, _action_errno(_errno.ENOSYS)),
        )
    )


def prepare(data: bytes) -> _SockFprog:
    """The ``sock_fprog`` that ``load`` hands to the kernel (it points at ``data``)."""
    return _SockFprog(len(data) // 8, data)


def load(data: bytes) -> None:
    """Install the filter ``data`` (from ``program``) on this thread and what it starts.

    Needs ``no_new_privs`` (or ``CAP_SYS_ADMIN``); raises ``OSError`` when refused.
    """
    install(prepare(data))


def install(fprog: _SockFprog) -> None:
    """Install the filter ``fprog`` (from ``prepare``) as ``load`` does."""
    if _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_SECCOMP): {os.strerror(code)}")
