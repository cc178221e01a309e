"""A local multi-node Ray cluster, run outside the pytest process tree for the Ray tests.

Run as ``python ray_cluster_host.py``: the process forks, the parent exits at once and the child
(the host) lives on, so neither the host nor Ray's daemons are descendants of pytest (the
suite's ``no_leaks`` guard looks at pytest's descendants only). The host is a child subreaper:
a process that a Ray child leaves behind (an orphan, a ``setsid`` escapee) is re-parented to the
host instead of init, so ``leftovers`` sees it.

It reads one JSON command per line on stdin and answers one JSON line on stdout:

- ``{"op": "start", "nodes": {name: {"num_cpus": n, "resources": {...}}}}``: a head node
  (``"head"``) plus the others; answers the address and each node's id.
- ``{"op": "remove_node", "name": ...}``: kills one node's processes (SIGKILL, as a lost machine).
- ``{"op": "leftovers"}``: processes in the host's tree that are not the cluster's own (each
  with its parent and state), and the Ray children's cgroups that still exist.
- ``{"op": "launchers"}``: the pids of the pools' launchers alive on the cluster.
- ``{"op": "wait_clean", "within": s, "launchers": [...]}``: ``leftovers`` once they are empty
  and no launcher is alive but those listed (the pools that existed before), or at the timeout.
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
#: in the command line of a pool's launcher (and of the workers it forks)
LAUNCHER = "zett_agent.process._child._launcher"
#: in the command line of a node's zygote, and of the launchers it forks and their workers
ZYGOTE = "zett_agent.process._child._zygote"
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
        procs, states = {}, {}
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                states[proc.pid] = proc.status()
                if states[proc.pid] != psutil.STATUS_ZOMBIE:
                    procs[proc.pid] = proc
        parents = {pid: _ppid(proc) for pid, proc in procs.items()}
        workers = {
            pid for pid, proc in procs.items() if parents[pid] in raylets and not _is_agent(proc)
        }
        cmdlines = {}
        for pid, proc in procs.items():
            with contextlib.suppress(psutil.Error):
                cmdlines[pid] = " ".join(proc.cmdline())
        # a Ray worker's pools: each a launcher, and the idle workers the launcher forked (a
        # fork of the launcher shows the launcher's command line); a child's tree lives below
        # a pool worker, and whatever else is below a Ray worker is a leftover
        launchers = {
            pid for pid in procs if parents[pid] in workers and "_launcher" in cmdlines.get(pid, "")
        }
        # a node's zygotes (each of the runner's secret and a pool configuration: a gate and
        # its template), and the launchers they forked for the Ray workers' pools: the
        # cluster's own while it lives (a zygote ends with its raylet); a child's tree below
        # them is a leftover, as below a Ray worker
        zygotes = {
            pid
            for pid in procs
            if ZYGOTE in cmdlines.get(pid, "") and cmdlines.get(parents[pid]) != cmdlines.get(pid)
        }
        launchers |= {pid for pid in procs if parents[pid] in zygotes and pid not in zygotes}
        pool_workers = {
            pid
            for pid in procs
            if parents[pid] in launchers and cmdlines.get(pid) == cmdlines.get(parents[pid])
        }
        found = []
        for pid in procs:
            escaped = parents[pid] == os.getpid() and pid not in daemons and pid not in zygotes
            below_worker, up = False, parents[pid]
            if pid in launchers or pid in pool_workers or pid in zygotes:
                up = 0
            while up in parents:
                if up in workers or up in zygotes:
                    below_worker = True
                    break
                up = parents[up]
            if escaped or below_worker:
                # the state tells a process that lives on from one on its way out (an empty
                # command line: its memory is gone, it is not yet a zombie)
                about = f"parent {parents[pid]}, {states[pid]}"
                found.append(f"{pid} ({about}) {cmdlines.get(pid, '?')[:100]}")
        return {"leftovers": found, "cgroups": _task_cgroups(self.ever)}

    def launchers(self) -> dict[str, Any]:
        """The launchers of the pools alive on the cluster (a pool worker, a fork of its
        launcher, shows the same command line: it is not counted)."""
        procs = {}
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    procs[proc.pid] = (_ppid(proc), " ".join(proc.cmdline()))
        found = [
            pid
            for pid, (parent, cmdline) in procs.items()
            if LAUNCHER in cmdline and procs.get(parent, (0, ""))[1] != cmdline
        ]
        # a zygote's launchers: its template's children (a zygote's gate and template are
        # processes of a zygote's command line whose parent's is not the same)
        zygotes = {
            pid
            for pid, (parent, cmdline) in procs.items()
            if ZYGOTE in cmdline and procs.get(parent, (0, ""))[1] != cmdline
        }
        found += [p for p, (parent, _) in procs.items() if parent in zygotes and p not in zygotes]
        return {"launchers": sorted(found)}

    def wait_clean(self, within: float, launchers: list[int] | None = None) -> dict[str, Any]:
        """Wait until nothing is left (``leftovers``) or ``timeout`` passes: for a test whose
        driver died or exited, where Ray ends the driver's workers and the task's sentinel
        cleans up, each on its own schedule. With ``launchers`` (the pools alive before the
        driver started), also wait until the driver's own pools are gone: a Ray worker that
        Ray has not ended yet holds its pool, which is no leftover yet, but would be one
        the moment Ray kills the worker and the pool's launcher is re-parented here."""
        deadline = time.monotonic() + within
        before = set(launchers or ())
        track = launchers is not None
        while True:
            answer = self.leftovers()
            answer["launchers"] = (
                [pid for pid in self.launchers()["launchers"] if pid not in before] if track else []
            )
            clean = not (answer["leftovers"] or answer["cgroups"] or answer["launchers"])
            if clean or time.monotonic() > deadline:
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


def _task_cgroups(ever: set[int]) -> list[str]:
    """The pool cgroups of the cluster's Ray workers that outlived their worker with processes
    still in them (a pool cgroup is named ``pool-HOSTPID-START-N``; a live worker's pool keeps
    its own until it exits). An empty one of a dead worker (Ray ended it, or a reaper killed
    it) is the engine's to remove: the next pool on that host cgroup does, once it is stale.
    Cgroups of pools this cluster did not start (other programs on the machine) are not
    looked at."""
    from zett_agent.process._containment import _cgroup

    host, _ = _cgroup._base()
    if host is None:
        return []
    try:
        names = os.listdir(f"{host}/{_cgroup.DIR_NAME}")
    except OSError:
        return []
    left = []
    for name in names:
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != "pool" or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        path = f"{host}/{_cgroup.DIR_NAME}/{name}"
        if pid in ever and _cgroup._start_time(pid) != parts[2] and _cgroup.populated(path):
            left.append(name)
    return sorted(left)


def _remove_task_cgroup_base() -> None:
    from zett_agent.process._containment import _cgroup

    host, _ = _cgroup._base()
    if host is not None:
        with contextlib.suppress(OSError):  # not there, or not empty: left as it is
            os.rmdir(f"{host}/{_cgroup.DIR_NAME}")


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
