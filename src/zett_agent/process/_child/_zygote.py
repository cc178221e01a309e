"""The zygote: processes that import a pool configuration's modules once and fork launchers.

Pools of many hosts on one machine (the Ray workers of a node, each with a pool of its own)
would each start a launcher that imports the same modules: the agent runtime and a model
SDK, most of a second of CPU apiece. A zygote imports them, and runs the pool's warm-up,
once; each of those pools then gets its launcher as a fork of the zygote, warm at once, on
pages shared with every other launcher of the machine. The launcher is the pool's own as
before (its session, its cgroup, its workers, its host's fate: ``_launcher.serve_forked``);
the zygote keeps nothing of it and is trusted with nothing after the fork.

A zygote is two processes, so that no launcher is a copy of one that knew the secret:

- the *gate* (``main``) holds the secret, listens on the socket and checks each host
  (``_wire._zygote_proof``); it imports nothing of the pool. Started with ``posix_spawn`` by
  a host that found no zygote, it reads its configuration (one JSON line: ``secret`` in hex,
  ``parts``, ``preload``, ``warm_up``, ``watch`` as ``[pid, start time]`` or null, ``idle``
  seconds) from stdin, binds its socket, and writes ``taken`` on stdout when another zygote
  holds the name; else it forks and exits, and the fork goes on as the gate, the child of no
  host: it listens, writes ``bound``, starts the template, and serves one host at a time (a
  host gets ``PEER_TIMEOUT`` seconds for each of its messages);
- the *template* (``template``), started by the gate without the secret, imports the modules,
  runs the warm-up, and forks a launcher for each request the gate passes on (the request
  as JSON, with the launcher's control socket and a pidfd of the host attached), answering
  with its pid; a launcher, every worker it forks and every job they run are copies of the
  template's memory, in which a job could look for the secret if it were there.

The gate forks a launcher only for a host that proves it holds the secret, runs as the same
user and is the process it names (``SO_PEERCRED``); the host's pidfd is opened while the host
waits for the answer. The template ends once it has had no launcher alive for ``idle``
seconds, or when the gate is gone; the gate ends when the template ended or when the process
it watches ends (a Ray node's raylet). Launchers alive then live on, each until its host is
gone.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any

from .._containment import _scan
from .._wire._protocol import CONTROL_FD
from .._wire._zygote_proof import LIMITS, NONCE, PROOF, proof, socket_name, valid

__all__ = ["main", "template"]

#: seconds a host has for each of its messages
PEER_TIMEOUT = 2.0
#: seconds the gate waits for the template's answer (its first one waits for its imports)
TEMPLATE_TIMEOUT = 120.0
#: where the template finds its socket to the gate
GATE_FD = CONTROL_FD
#: seconds between two looks at whether a template that has not answered yet is stopped
_STOPPED_LOOK = 0.25
_TEMPLATE_BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from zett_agent.process._child._zygote import template; template()"
)


def _noop(signum: int, frame: object) -> None:
    """SIGCHLD's handler: the wake-up descriptor is what wakes the loop."""


# -- the gate ---------------------------------------------------------------------------------


class _Gate:
    def __init__(self, listener: socket.socket, config: dict[str, Any]) -> None:
        self.listener = listener
        self.secret = bytes.fromhex(config["secret"])
        self.watch = -1
        watch = config.get("watch")
        if watch is not None:
            pid, start = watch
            self.watch = os.pidfd_open(pid)  # raises if it is gone already: nothing to serve
            if _scan.start_time(pid) != start:
                raise ProcessLookupError(f"process {pid} is not the one to watch")
        gate_end, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if template_end.fileno() == GATE_FD:  # (a dup2 onto itself would keep close-on-exec)
            moved = socket.socket(fileno=os.dup(template_end.fileno()))
            template_end.close()
            template_end = moved
        try:
            self.template = os.posix_spawn(
                sys.executable,
                [
                    sys.executable,
                    "-c",
                    _TEMPLATE_BOOTSTRAP,
                    json.dumps(sys.path),
                    json.dumps(config["preload"]),
                    str(config["warm_up"]),
                    str(float(config["idle"])),
                ],
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, template_end.fileno(), GATE_FD),
                ],
            )
        finally:
            template_end.close()
        self.to_template = gate_end
        self.template_fd = os.pidfd_open(self.template)

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ, "listener")
        selector.register(self.template_fd, selectors.EVENT_READ, "template")
        if self.watch >= 0:
            selector.register(self.watch, selectors.EVENT_READ, "watch")
        while True:
            for key, _ in selector.select():
                if key.data == "template":
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(self.template, 0)  # it ended: reaped, then the gate ends
                    return
                if key.data != "listener":
                    return  # what this zygote watches ended (the template then ends too)
                with contextlib.suppress(OSError):
                    conn, _ = self.listener.accept()
                    with conn:
                        conn.settimeout(PEER_TIMEOUT)
                        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        """One exchange (see ``_zygote_proof``); a host that fails any step gets nothing."""
        theirs = conn.recv(NONCE + 1)
        if len(theirs) != NONCE:
            return
        mine = os.urandom(NONCE)
        conn.send(proof(self.secret, b"zygote", theirs) + mine)
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 2)
        try:
            if len(fds) != 1 or not valid(self.secret, b"host", mine, data[:PROOF]):
                return
            request = json.loads(data[PROOF:])
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid() or pid != request["host_pid"]:
                conn.send(json.dumps({"error": "the peer is not the host it names"}).encode())
                return
            host = os.pidfd_open(pid)  # while the host waits for this answer: it is alive
            try:
                socket.send_fds(self.to_template, [data[PROOF:]], [fds[0], host])
            finally:
                os.close(host)
            answer = json.loads(self._template_answer())
            conn.send(json.dumps({**answer, "template": self.template}).encode())
        finally:
            for fd in fds:
                os.close(fd)

    def _template_answer(self) -> bytes:
        """The template's answer; ``b""`` when it gave none in time, or is stopped (killed).

        A stopped template (a job stopped it, where the kernel lets it: below Linux 6.12)
        never answers: it is killed, the gate ends, and the next host starts a new zygote.
        """
        deadline = time.monotonic() + TEMPLATE_TIMEOUT
        poller = select.poll()
        poller.register(self.to_template, select.POLLIN)
        while not poller.poll(int(_STOPPED_LOOK * 1000)):
            found = _scan.state(self.template)
            if time.monotonic() > deadline or (found is not None and found[1] in "Tt"):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self.template_fd, signal.SIGKILL)
                return b""
        return self.to_template.recv(4096)


def main() -> None:
    """Entry point of the gate, which a host starts (see the module docstring)."""
    config = json.loads(sys.stdin.buffer.readline())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(socket_name(bytes.fromhex(config["secret"]), config["parts"]))
    except OSError:
        sys.stdout.write("taken\n")
        return
    if os.fork() != 0:
        os._exit(0)
    # listened to here: a host's ``SO_PEERCRED`` names the process that listens (the gate)
    listener.listen(128)
    sys.stdout.write("bound\n")
    sys.stdout.flush()
    # nothing of the host that started it is held any more (its descriptors a library opened
    # without close-on-exec included: a zygote outlives its host)
    keep = listener.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        gate = _Gate(listener, config)
    except OSError:
        os._exit(0)  # what it was to watch is gone: nobody to serve
    del config  # (the gate's own memory: no launcher is a copy of it)
    try:
        gate.run()
    except Exception as exc:
        sys.stderr.write(f"zett-agent zygote {os.getpid()}: {type(exc).__name__}: {exc}\n")
    os._exit(0)  # the template sees its socket close, and ends


# -- the template -----------------------------------------------------------------------------


class _Template:
    def __init__(self, gate: socket.socket, idle: float) -> None:
        self.gate = gate
        self.idle = idle
        #: what the imports or the warm-up raised ("" when they worked): every launcher's
        #: hello reports it, as a launcher that imported for itself would
        self.error = ""
        #: launchers forked and not reaped yet
        self.launchers: set[int] = set()
        self.idle_since = time.monotonic()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector = selectors.DefaultSelector()

    def prepare(self, preload: list[str], warm_up: str) -> None:
        """Import what every launcher of the configuration imports, and run its warm-up."""
        from . import _launcher

        try:
            _launcher.import_engine()
            for name in preload:
                importlib.import_module(name)
            if warm_up:
                _launcher.rehearse(warm_up)
        except BaseException as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        gc.freeze()  # shared with every launcher and worker from here on (see ``_launcher``)

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _noop)
        self.selector.register(self.gate, selectors.EVENT_READ, "gate")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            self._reap()
            timeout = None
            if not self.launchers:
                timeout = self.idle_since + self.idle - time.monotonic()
                if timeout <= 0:
                    return
            for key, _ in self.selector.select(timeout):
                if key.data == "gate":
                    if not self._fork_one():
                        self._reap()
                        return  # the gate is gone
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 4096):
                            pass

    def _reap(self) -> None:
        while self.launchers:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.launchers.clear()
            else:
                if pid == 0:
                    break
                self.launchers.discard(pid)
            if not self.launchers:
                self.idle_since = time.monotonic()

    def _fork_one(self) -> bool:
        """Fork the launcher the gate asks for; False once the gate is gone."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.gate, 1 << 20, 2)
        except OSError:
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        try:
            request = json.loads(data)
            ctrl, host = fds
            pid = os.fork()
            if pid == 0:
                self._launch(request, ctrl, host)
            self.launchers.add(pid)
            self.gate.send(json.dumps({"pid": pid}).encode())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            with contextlib.suppress(OSError):
                self.gate.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _launch(self, request: dict[str, Any], ctrl: int, host: int) -> None:
        """In the fork: become the launcher, then exit."""
        code = 70
        try:
            from . import _launcher

            self._become_launcher(request, ctrl)
            _launcher.serve_forked(
                host,
                int(request["max_frame_bytes"]),
                dict(request["cgroups"]),
                int(request["nice"]),
                self.error,
            )
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)

    def _become_launcher(self, request: dict[str, Any], ctrl: int) -> None:
        """Drop the template's state, take the host's.

        What the host's ``posix_spawn`` of a launcher gives it: a session of its own, default
        signal handling, the host's environment, working directory, umask, niceness and
        limits, and the control socket at ``CONTROL_FD`` (where the gate's socket was).
        """
        import resource

        os.setsid()
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        # descriptors only: the objects' state is the template's (pages it shares)
        for fd in (self.selector.fileno(), self.wake_r, self.wake_w, self.gate.detach()):
            os.close(fd)
        os.dup2(ctrl, CONTROL_FD, inheritable=False)
        os.close(ctrl)
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(int(request["umask"]))
        with contextlib.suppress(OSError):
            os.chdir(request["cwd"])
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, int(request["priority"]))
        for name, (soft, hard) in request["limits"].items():
            if name in LIMITS:
                with contextlib.suppress(OSError, ValueError):
                    resource.setrlimit(getattr(resource, name), (soft, hard))


def template() -> None:
    """Entry point of the template, which the gate starts (see the module docstring)."""
    preload, warm_up, idle = json.loads(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    gate = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=GATE_FD)
    zygote = _Template(gate, idle)
    zygote.prepare(list(preload), warm_up)
    try:
        zygote.run()
    except Exception as exc:
        sys.stderr.write(f"zett-agent zygote {os.getpid()}: {type(exc).__name__}: {exc}\n")
    os._exit(0)
