"""A local multi-node Ray cluster, run outside the pytest process tree for the Ray tests.

Run as ``python _cluster_host.py``: the process forks, the parent exits at once and the child
(the host) lives on, so neither the host nor Ray's daemons are descendants of pytest (the
suite's ``no_leaks`` guard looks at pytest's descendants only). The host is a child subreaper:
a process that a Ray child leaves behind (an orphan, a ``setsid`` escapee) is re-parented to the
host instead of init, so ``leftovers`` sees it.

It reads one JSON command per line on stdin and answers one JSON line on stdout:

- ``{"op": "start", "nodes": {name: {"num_cpus": n, "resources": {...}}}}``: a head node
  (``"head"``) plus the others; answers the address and each node's id.
- ``{"op": "remove_node", "name": ...}``: kills one node's processes (SIGKILL, as a lost machine).
- ``{"op": "leftovers"}``: processes in the host's tree that are not the cluster's own, and
  the Ray children's cgroups that still exist.
- ``{"op": "wait_clean", "within": s}``: ``leftovers`` once they are empty, or at the timeout.
- ``{"op": "kill_cluster"}``: SIGKILLs every Ray process (the cluster goes away abruptly).
- ``{"op": "shutdown"}``: shuts the cluster down, checks nothing is left, exits.

End of stdin (pytest died) shuts the cluster down too.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

import psutil

PR_SET_CHILD_SUBREAPER = 36
#: processes Ray starts under a raylet that are not workers
AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
NODE_ARGS: dict[str, Any] = {
    "object_store_memory": 80 * 2**20,
    "node_ip_address": "127.0.0.1",
}


class Host:
    def __init__(self) -> None:
        self.cluster: Any = None
        self.nodes: dict[str, Any] = {}
        self.ever: set[int] = set()

    def start(self, nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
        from ray.cluster_utils import Cluster

        head = nodes.get("head", {})
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={**NODE_ARGS, "include_dashboard": False, **head},
        )
        self.nodes["head"] = self.cluster.head_node
        for name, args in nodes.items():
            if name != "head":
                self.nodes[name] = self.cluster.add_node(**NODE_ARGS, **args)
        self.cluster.wait_for_nodes()
        self._remember()
        return {
            "address": self.cluster.address,
            "session_dir": self.cluster.head_node.get_session_dir_path(),
            "nodes": {name: node.node_id for name, node in self.nodes.items()},
        }

    def daemons(self) -> set[int]:
        """The pids of the processes Ray started for its nodes (gcs, raylets, dashboard, ...)."""
        return {pid for node in self.nodes.values() for pid in self._pids(node)}

    @staticmethod
    def _pids(node: Any) -> set[int]:
        return {info.process.pid for infos in node.all_processes.values() for info in infos}

    def _remember(self) -> None:
        self.ever |= {p.pid for p in psutil.Process().children(recursive=True)}

    def add_node(self, name: str, **args: Any) -> dict[str, Any]:
        # add_node waits until this node is alive; not wait_for_nodes(), which also waits
        # until the cluster noticed that a node removed before is dead (its health checks)
        self.nodes[name] = node = self.cluster.add_node(**NODE_ARGS, **args)
        self._remember()
        return {"id": node.node_id}

    def remove_node(self, name: str) -> dict[str, Any]:
        node = self.nodes.pop(name)
        raylets = [
            p for p in psutil.Process().children() if p.pid in self._pids(node) and _is_raylet(p)
        ]
        workers = [w for r in raylets for w in r.children(recursive=True)]
        self.cluster.remove_node(node, allow_graceful=False)
        # a lost machine takes its workers with it (Ray's own would linger a while)
        for proc in workers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(workers, timeout=10)
        # and the workers its raylet started meanwhile, now orphans of this subreaper
        daemons = self.daemons()
        for proc in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if proc.pid not in daemons and " ".join(proc.cmdline()).startswith("ray::"):
                    proc.kill()
        self._reap()
        return {}

    def leftovers(self) -> dict[str, Any]:
        self._reap()
        self._remember()
        daemons = self.daemons()
        raylets = {p.pid for p in psutil.Process().children() if p.pid in daemons and _is_raylet(p)}
        procs = {}
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    procs[proc.pid] = proc
        parents = {pid: _ppid(proc) for pid, proc in procs.items()}
        workers = {
            pid for pid, proc in procs.items() if parents[pid] in raylets and not _is_agent(proc)
        }
        found = []
        for pid, proc in procs.items():
            escaped = parents[pid] == os.getpid() and pid not in daemons
            below_worker, up = False, parents[pid]
            while up in parents:
                if up in workers:
                    below_worker = True
                    break
                up = parents[up]
            if escaped or below_worker:
                with contextlib.suppress(psutil.Error):
                    found.append(f"{pid} (parent {parents[pid]}) {' '.join(proc.cmdline())[:100]}")
        return {"leftovers": found, "cgroups": _task_cgroups()}

    def wait_clean(self, within: float) -> dict[str, Any]:
        """Wait until nothing is left (``leftovers``) or ``timeout`` passes: for a test whose
        driver died, where the task's sentinel cleans up on its own schedule."""
        deadline = time.monotonic() + within
        while True:
            answer = self.leftovers()
            if not (answer["leftovers"] or answer["cgroups"]) or time.monotonic() > deadline:
                return answer
            time.sleep(0.02)

    def kill_cluster(self) -> dict[str, Any]:
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        self._reap()
        return {}

    def shutdown(self) -> dict[str, Any]:
        if self.cluster is not None:
            self._remember()
            with contextlib.suppress(Exception):
                self.cluster.shutdown()
            self.cluster = None
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _gone, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=10)
        self._reap()
        still = [p.pid for p in alive] + [p for p in self.ever if _alive(p)]
        # The runner keeps the base of its task cgroups on a node (other drivers' tasks may
        # use it any time); with the cluster gone, the tests remove it, empty, from this machine.
        _remove_task_cgroup_base()
        return {"alive": sorted(set(still))}

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return


def _task_cgroups() -> list[str]:
    """The Ray children's cgroups that still exist (the workers share this host's cgroup)."""
    from zett_agent.runners import _ray_contain

    own = _ray_contain._own_cgroup()
    if own is None:
        return []
    try:
        names = os.listdir(f"{own}/{_ray_contain.DIR_NAME}")
    except OSError:
        return []
    return sorted(name for name in names if name.startswith("task-"))


def _remove_task_cgroup_base() -> None:
    from zett_agent.runners import _ray_contain

    own = _ray_contain._own_cgroup()
    if own is not None:
        with contextlib.suppress(OSError):  # not there, or not empty: left as it is
            os.rmdir(f"{own}/{_ray_contain.DIR_NAME}")


def _is_raylet(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return os.path.basename(proc.exe()) == "raylet"
    return False


def _is_agent(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline()).startswith(AGENTS)
    return False


def _ppid(proc: psutil.Process) -> int:
    try:
        return int(proc.ppid())
    except psutil.Error:
        return 0


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def serve() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host = Host()
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = getattr(host, op)(**request)
        except Exception as error:
            answer = {"error": f"{type(error).__name__}: {error}", "tb": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        out.flush()
        if op == "shutdown":
            return
    host.shutdown()


def main() -> None:
    if os.fork() != 0:
        os._exit(0)  # the parent returns to pytest at once; the host is not its descendant
    os.setsid()
    # Ray's log lines go to a file, never into the pipe the answers travel on.
    log = os.open(os.environ.get("ZETT_RAY_HOST_LOG", os.devnull), os.O_WRONLY | os.O_CREAT)
    answers = os.dup(1)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout = open(answers, "w")  # noqa: SIM115 (lives as long as the process)
    serve()


if __name__ == "__main__":
    main()
