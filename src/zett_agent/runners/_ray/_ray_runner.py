"""``RayRunner``: its options, its connection to Ray, submitting children, and stopping them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ray

from zett_agent._checks import check_choice, check_int, check_number, check_seconds, described
from zett_agent.process import ProcessLimits, Sandbox
from zett_agent.process._limits import check_limits
from zett_agent.process._sandbox._options import check_sandbox
from zett_agent.runners._broker._standin import relaying
from zett_agent.runners._child import ChildSpec, run_child, unpicklable_part
from zett_agent.runners._preload import RUNTIME_MODULES, excluded
from zett_agent.runners._ray import _ray_cluster, _ray_task
from zett_agent.runners._ray._ray_driver import JobDriver
from zett_agent.runners._ray._ray_job import RayJob
from zett_agent.runners._ray._ray_options import (
    check_placement,
    check_resources,
    init_arguments,
    local_ray,
)

__all__ = ["RayRunner"]

log = logging.getLogger(__name__)

#: objects a running task may have in flight before its generator pauses (backpressure)
STREAM_BACKPRESSURE = 64
#: seconds the prestarted workers may take to all run (``prestart_workers``)
PRESTART_TIMEOUT = 120.0
_CONTAINMENTS = ("auto", "cgroup", "scan")
#: what a brokered child imports beyond the runtime
_BROKER_MODULES = ("zett_agent.runners._broker._standin", "zett_agent.process._child._inbox")
#: Ray kills a worker's own children when the worker exits, before they can clean up: off for
#: the workers of this runner, whose only child is their pool's launcher, which kills every
#: tree it started once its host is gone (and would be killed first otherwise)
_KEEP_CHILDREN = {"RAY_kill_child_processes_on_worker_exit": "0"}
#: the GCS address of the local Ray a runner of this process started, whose system config
#: keeps the workers' children already: the other runners of the process that join it need
#: no runtime environment for that (with one, each Ray worker starts through Ray's
#: ``setup_worker``: a second interpreter importing Ray, about 0.3 s of CPU per worker)
_local_gcs: str | None = None


class RayRunner:
    """Runs each child agent as a Ray task, on this machine or a Ray cluster.

    Select it with ``AsyncSubAgentExtension(definitions, runner=RayRunner(...))`` (or
    ``SubAgentExtension``): the tools, the registry, the notices, the limits and
    ``_create_child`` behave as with processes. ``task_info`` adds ``node_id``.

    Each child is one Ray generator task, and runs in a fresh process of a ``ProcessPool`` that
    its Ray worker keeps (``_ray_node``): its code never runs in the Ray worker itself, and it
    gets what the pool gives every job (containment, a Landlock domain, limits, a sandbox,
    bounded decoding of what it sends), then the driver decodes it again within its own
    budgets. See ``docs/ray.md`` for what holds on which kernel.

    Args:
        address: ``None`` starts a local Ray listening on 127.0.0.1 only (or uses the Ray
            this process already joined); ``"auto"`` joins the cluster this machine belongs
            to; ``"ray://host:port"`` or ``"host:port"`` joins that cluster.
        num_cpus: Ray CPUs each child requests (default 1: Ray runs as many children at once
            on a node as it has CPUs; lower it for children that mostly wait on a model).
        resources: Ray custom resources each child requests (placement), e.g. ``{"big": 1}``.
        placement: Per-definition overrides of ``num_cpus`` and ``resources``, by definition
            name: ``{"coder": {"num_cpus": 4, "resources": {"big": 1}}}``.
        limits: Default ``ProcessLimits`` where neither the extension nor the definition sets
            any. ``timeout`` is enforced from here; ``memory_bytes`` is also Ray's ``memory=``
            request; the others apply as in the process engine, on the node.
            ``max_processes`` and ``tree_memory_bytes`` are refused.
        max_retries: Ray retries of a child whose Ray worker died (default 0: never twice).
        fresh_workers: A new Ray worker per child (Ray's ``max_calls=1``). Default off: each
            child has a fresh process of its own anyway, and a reused Ray worker keeps its
            warm pool (a new one costs a Ray worker and a pool start).
        containment: The node pools' ``containment``: ``"auto"``, ``"cgroup"`` (a child fails
            on a node without it) or ``"scan"``.
        kill_from_host: When a child's tree must be killed from outside its Ray worker, do
            it from this process if it runs on this machine (the default) rather than through
            the node's reaper actor; messages to the child (``task_message``) take the same way.
        max_frame_bytes: The largest frame a child may send, as for ``ProcessPool`` (same
            default): enforced by its node's pool, and again here.
        max_buffered_events: Unread events kept per child, as for ``ProcessPool``.
        max_buffered_bytes: The decoded size of one event or result, and of the unread events
            together, as for ``ProcessPool`` (same default): enforced on the node and here.
        init_kwargs: Extra ``ray.init`` arguments when this runner connects. By default the
            workers' output is not forwarded (``log_to_driver=False``), and a local Ray
            started here listens on 127.0.0.1 only, without its dashboard.
        prestart_workers: For a local Ray started here: Python workers started in
            ``connect()`` and kept while idle (default 0: Ray starts a worker per child as it
            comes, about one a second on a 2-core machine, and ends idle ones beyond one per
            CPU). Each is a Ray worker process, kept while idle; its node pool starts with its
            first child.
        kill_timeout: Seconds a kill may take to confirm a tree dead.
        end_timeout: Seconds to wait for Ray to report a killed task's end before the job
            settles anyway (its node or the cluster is gone).

    Raises:
        TypeError, ValueError: a bad option (the message names it).
    """

    #: Ray children are killed at once (no SIGTERM first)
    kill_grace = 0.0

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        placement: Mapping[str, Mapping[str, Any]] | None = None,
        limits: ProcessLimits | None = None,
        max_retries: int = 0,
        fresh_workers: bool = False,
        containment: str = "auto",
        kill_from_host: bool = True,
        max_frame_bytes: int = 64 * 1024 * 1024,
        max_buffered_events: int = 1024,
        max_buffered_bytes: int = 256 * 1024 * 1024,
        init_kwargs: Mapping[str, Any] | None = None,
        prestart_workers: int = 0,
        kill_timeout: float = 20.0,
        end_timeout: float = 15.0,
    ) -> None:
        if address is not None and not isinstance(address, str):
            raise TypeError(
                f"RayRunner(address=...) must be None or a str such as 'auto', got "
                f"{described(address)}"
            )
        check_number("RayRunner(num_cpus=...)", num_cpus)
        check_int("RayRunner(max_retries=...)", max_retries, 0)
        check_int("RayRunner(prestart_workers=...)", prestart_workers, 0, 1024)
        check_choice("RayRunner(containment=...)", containment, _CONTAINMENTS)
        for name, value in (("kill_timeout", kill_timeout), ("end_timeout", end_timeout)):
            check_seconds(f"RayRunner({name}=...)", value, above=True)
        for name, count, low in (
            ("max_frame_bytes", max_frame_bytes, 16),
            ("max_buffered_events", max_buffered_events, 1),
            ("max_buffered_bytes", max_buffered_bytes, 1 << 16),
        ):
            check_int(f"RayRunner({name}=...)", count, low)
        self.address = address
        self.num_cpus = float(num_cpus)
        self.resources = check_resources("resources", resources or {})
        self.placement = {
            str(name): check_placement(name, options) for name, options in (placement or {}).items()
        }
        self.limits = check_limits(limits, "RayRunner(limits=...)")
        self.max_retries = max_retries
        self.fresh_workers = bool(fresh_workers)
        self.containment = containment
        self.kill_from_host = bool(kill_from_host)
        self.max_frame_bytes = max_frame_bytes
        self.max_buffered_events = max_buffered_events
        self.max_buffered_bytes = max_buffered_bytes
        self.init_kwargs = dict(init_kwargs or {})
        self.prestart_workers = prestart_workers
        self.kill_timeout = float(kill_timeout)
        self.end_timeout = float(end_timeout)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._remote: dict[bool, Any] | None = None
        #: what the jobs may ask of this runner, and the jobs it runs
        self._driver = JobDriver(self)
        self._initialized_here = False
        self._started_local = False
        #: modules the children will import (``warm_up``), preloaded by the node pools
        self._modules: tuple[str, ...] = ()
        #: the secret of this runner's zygotes, one per node and configuration: each imports
        #: the node pools' modules once, and forks their launchers (``_ray_node``); only the
        #: runner's tasks hold it (a child never sees its task's arguments)
        self._zygote = secrets.token_hex(32)

    def __repr__(self) -> str:
        state = "closed" if self._driver.closed else "connected" if self._remote else "new"
        return f"<RayRunner {state} address={self.address!r} containment={self.containment}>"

    # A runner travels inside a definition when a child starts children of its own: only its
    # configuration goes (inside a child, it joins the cluster its child runs in).
    _CONFIG = (
        "address", "num_cpus", "resources", "placement", "limits", "max_retries",
        "fresh_workers", "containment", "kill_from_host", "max_frame_bytes",
        "max_buffered_events", "max_buffered_bytes", "init_kwargs", "prestart_workers",
        "kill_timeout", "end_timeout",
    )  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._CONFIG}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- connection -------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to Ray (start a local one for ``address=None``) unless already connected.

        Blocks the calling thread while Ray starts (seconds for a local Ray; tens of seconds
        on a loaded two-core machine): call it at startup, before serving, from the thread
        that lives as long as the program (Ray ties the processes it starts to that thread).
        Otherwise the first child connects, on the event loop.

        Raises:
            RuntimeError: The runner is closed.
            Exception: Ray's own errors (a cluster that cannot be reached).
        """
        if self._driver.closed:
            raise RuntimeError("this RayRunner is closed; create a new one")
        if not ray.is_initialized():
            address = self.address
            nested = os.environ.get(_ray_task.NESTED_ADDRESS)
            if address is None and nested:
                address = nested  # a child of a Ray child: its own children join its cluster
            local = address is None
            kwargs = init_arguments(address, self.init_kwargs, self.prestart_workers)
            with local_ray(local):
                ray.init(**kwargs)
            self._initialized_here = True
            self._started_local = local
            if local:
                global _local_gcs
                _local_gcs = ray.get_runtime_context().gcs_address
            if local and self.prestart_workers:
                _prestart(self.prestart_workers)
        if self._remote is None:
            options: dict[str, Any] = {}
            joined_ours = _local_gcs is not None and _local_gcs == _gcs_address()
            if not (self._started_local or joined_ours):
                # a cluster this runner did not start: ask it per task (merged with the job's)
                options["runtime_env"] = {"env_vars": dict(_KEEP_CHILDREN)}
            reused = ray.remote(**options) if options else ray.remote
            self._remote = {
                True: ray.remote(max_calls=1, **options)(_ray_task.run_task_fresh),
                False: reused(_ray_task.run_task),
            }

    def warm_up(self, modules: Iterable[str] = ()) -> None:
        """Note the modules the children will import.

        Note the modules the children will import (the node pools preload them); never blocks, never
        connects. Call ``connect()`` at startup to have Ray ready before the first child.
        """
        names = [name for name in modules if not excluded(name, ("__main__",))]
        self._modules = tuple(dict.fromkeys((*self._modules, *names)))

    # -- submitting -------------------------------------------------------------------------

    async def submit(
        self,
        spec: ChildSpec,
        *,
        limits: ProcessLimits | None = None,
        sandbox: Sandbox | None = None,
    ) -> RayJob:
        """Start one subagent child (``run_child(spec)``) as a Ray task and return its job.

        ``limits`` (the extension's or the definition's) or the runner's own apply; the
        definition's ``placement`` entry, if any, chooses CPUs and resources. ``sandbox`` is
        enforced by the child's node, as ``ProcessPool.submit`` does (a required one that the
        node cannot enforce fails the child with ``SandboxUnavailable``; the job's ``info()``
        says what was enforced). A brokered or sandboxed child gets keyless stand-ins for its
        brokerable models, and its calls are made by its Ray task on the node, with the real
        models: their keys reach the node's Ray worker, never the child.

        Raises:
            TypeError: The spec cannot be shipped to Ray (the message names the part).
            ValueError: A limit Ray children cannot have (``max_processes``,
                ``tree_memory_bytes``), ``ProcessLimits.env``/``cwd`` with a sandbox, or a
                sandbox with ``Egress`` (not supported on Ray).
            RuntimeError: The runner is closed.
        """
        options = self.placement.get(spec.definition.name, {})
        sandbox = check_sandbox(sandbox, "RayRunner.submit(sandbox=...)")
        if sandbox is not None and sandbox.network_kind == "egress":
            raise ValueError(
                "Sandbox(network=Egress(...)) is not supported on Ray: the proxy a child's "
                "connections go through runs in the host of its process pool, which a Ray "
                "worker's is not. Use network='none' or 'all' on Ray, or run the child with "
                "ProcessRunner"
            )
        models: list[Any] | None = None
        brokered = spec.broker or sandbox is not None or relaying()
        try:
            if brokered:
                from zett_agent.runners._broker._parent import pickle_brokered

                payload, models = pickle_brokered(spec)
            else:
                payload = _pickle((run_child, (spec,), {}))
        except Exception as exc:  # cloudpickle raises more than TypeError
            part = unpicklable_part(spec) or f"{type(exc).__name__}: {exc}"
            raise TypeError(
                f"cannot start a child of {spec.definition.name!r} on Ray: {part}. Everything "
                "a child needs is pickled to its node: keep locks, clients, connections "
                "and event loops out of what the definition holds, or define the class in an "
                "importable module"
            ) from exc
        preload = (*RUNTIME_MODULES, *self._modules)
        if brokered:
            preload += _BROKER_MODULES
        return await self._submit(
            payload,
            brokered,
            models or None,
            limits or self.limits,
            sandbox,
            options.get("num_cpus"),
            options.get("resources"),
            preload=preload,
            name=spec.definition.name,
        )

    async def submit_function(
        self,
        fn: Callable[..., Any],
        *args: Any,
        limits: ProcessLimits | None = None,
        sandbox: Sandbox | None = None,
        num_cpus: float | None = None,
        resources: Mapping[str, float] | None = None,
        **kwargs: Any,
    ) -> RayJob:
        """Run ``fn(*args, **kwargs)`` (sync or async) as a child on Ray and return its job.

        Inside, ``zett_agent.runners.ray.emit(obj)`` (the same as ``zett_agent.process.emit``)
        streams a JSON-compatible event to the parent; ``fn`` returns JSON-compatible data.
        ``num_cpus``/``resources`` override the runner's for this call; ``sandbox`` as for
        ``submit``.

        Raises:
            RuntimeError: If the runner is closed.
            TypeError: If ``fn`` or its arguments cannot be pickled.
            ValueError: For ``max_processes`` or ``tree_memory_bytes`` in ``limits``.
        """
        if not callable(fn):
            raise TypeError(f"submit_function() takes a function first, got {fn!r:.60}")
        sandbox = check_sandbox(sandbox, "RayRunner.submit_function(sandbox=...)")
        try:
            payload = _pickle((fn, args, kwargs))
        except Exception as error:
            raise TypeError(f"cannot ship {fn!r:.80} to Ray: {error}") from error
        name = getattr(fn, "__qualname__", "job")
        return await self._submit(
            payload, False, None, limits or self.limits, sandbox, num_cpus, resources, name=name
        )

    async def _submit(
        self,
        payload: bytes,
        brokered: bool,
        models: list[Any] | None,
        limits: ProcessLimits | None,
        sandbox: Sandbox | None,
        num_cpus: float | None,
        resources: Mapping[str, float] | None,
        *,
        preload: tuple[str, ...] = (),
        name: str,
    ) -> RayJob:
        if self._driver.closed:
            raise RuntimeError("this RayRunner is closed; create a new one to start children")
        limits = check_limits(limits, "RayRunner.submit(limits=...)") or ProcessLimits()
        if limits.tree_wide:
            raise ValueError(
                f"RayRunner cannot enforce {', '.join(limits.tree_wide)} (they need the engine's "
                "cgroup controllers on every node); use memory_bytes (Ray's memory request and "
                "RLIMIT_AS) or run these children with ProcessRunner"
            )
        if sandbox is not None and (limits.env is not None or limits.cwd is not None):
            raise ValueError(
                "ProcessLimits.env and .cwd do not combine with a sandbox: its environment is "
                "minimal plus Sandbox.env, and its working directory is its scratch directory; "
                "pass the variables as Sandbox(env={...})"
            )
        self.connect()
        assert self._remote is not None
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus if num_cpus is None else num_cpus,
            "resources": dict(self.resources if resources is None else resources),
            "max_retries": self.max_retries,
            "retry_exceptions": False,
            "_generator_backpressure_num_objects": STREAM_BACKPRESSURE,
        }
        if limits.memory_bytes is not None:
            options["memory"] = limits.memory_bytes
        config = {
            "containment": self.containment,
            "max_frame_bytes": self.max_frame_bytes,
            "max_buffered_events": self.max_buffered_events,
            "max_buffered_bytes": self.max_buffered_bytes,
            "preload": tuple(preload),
            "zygote": self._zygote,
        }
        token = uuid.uuid4().hex
        generator = (
            self._remote[self.fresh_workers]
            .options(**options)
            .remote(payload, brokered, limits, sandbox, models, config, token)
        )
        return RayJob(self._driver, generator, limits, token, f"{name}-{token[:8]}")

    # -- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Kill every running child and disconnect.

        Kill every running child (``PoolClosed``), and disconnect if this runner connected (which
        ends the per-node reapers too). Bounded even when the cluster is gone. Idempotent.

        Cancellation: the kills already begun go on.
        """
        driver = self._driver
        if driver.closed:
            return
        driver.closed = True
        from zett_agent.process import PoolClosed

        kills = list(driver.jobs.values())
        await asyncio.gather(
            *(kill(PoolClosed("the RayRunner was closed")) for kill in kills),
            return_exceptions=True,
        )
        if not self._initialized_here:
            await driver.reapers.close()  # the connection is not ours to end
        else:
            driver.reapers.clear()
            if await driver.calls.run(_ray_cluster.gcs_reachable):
                await driver.calls.run(ray.shutdown)
            else:
                # ray.shutdown() waits for the lost cluster; Ray ends this driver process
                # after gcs_rpc_server_reconnect_timeout_s (60 s by default)
                log.warning("the Ray cluster is gone; not disconnecting from it")
        await driver.calls.close()

    async def __aenter__(self) -> RayRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _prestart(count: int) -> None:
    """Have the new local Ray start ``count`` workers now (``prestart_workers``), bounded."""
    from ray.experimental import internal_kv

    token = uuid.uuid4().hex
    task = ray.remote(num_cpus=0, max_retries=0)(_ray_task.prestart)
    refs = [task.remote(token, count, PRESTART_TIMEOUT) for _ in range(count)]
    try:
        ray.get(refs, timeout=2 * PRESTART_TIMEOUT)
    except Exception as error:  # slower than that: the children start workers as they come
        log.warning("prestarting %d Ray workers: %s", count, error)
    finally:
        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(
                f"zett-prestart/{token}/", del_by_prefix=True, namespace=_ray_task.KV_NAMESPACE
            )


def _pickle(value: object) -> bytes:
    import cloudpickle

    return bytes(cloudpickle.dumps(value))


def _gcs_address() -> str | None:
    with contextlib.suppress(Exception):
        return str(ray.get_runtime_context().gcs_address)
    return None
