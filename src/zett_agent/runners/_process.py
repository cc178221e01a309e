"""``ProcessRunner``: each child agent in its own OS process of a ``ProcessPool`` (the default)."""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zett_agent._checks import check_flag, check_int, check_names, check_seconds
from zett_agent.process import JobStatus, PoolClosed, ProcessError, ProcessPool
from zett_agent.process._host._job import retire_worker, set_event_filter
from zett_agent.runners._base import WrappedJob
from zett_agent.runners._broker._standin import relaying as _relaying
from zett_agent.runners._child import (
    ChildSpec,
    rehearse,
    run_child,
    run_pickled_child,
    unpicklable_part,
)
from zett_agent.runners._child_inbox import MESSAGE_TOPIC
from zett_agent.runners._preload import RUNTIME_MODULES, excluded

if TYPE_CHECKING:
    from zett_agent.process import ProcessJob, ProcessLimits, Sandbox
    from zett_agent.runners._broker._parent import Broker

__all__ = ["DEFAULT_MAX_CHILDREN", "DEFAULT_NICE", "ProcessChildJob", "ProcessRunner", "warming"]

#: what a brokered child imports beyond the runtime (preloaded with ``broker=True``)
_BROKER_MODULES = (
    "zett_agent.runners._broker._standin",
    "zett_agent.runners._broker._keys",
    "zett_agent.process._child._inbox",
)

log = logging.getLogger(__name__)

#: Default global cap on the processes one ``ProcessRunner`` runs at once, across every session
#: of its extension. A safety bound (against a model or a bug starting children without end),
#: not a scheduling knob: child agents mostly wait on a model, so every task ``max_concurrent``
#: admits should run at once. 256 running children of about 7 MiB unique memory each is under
#: 2 GiB, and their descriptors in the parent (a socket, and a pidfd with the reworked engine)
#: stay inside the common limit of 1024 open files.
DEFAULT_MAX_CHILDREN = 256
#: the children's niceness when none is given: background work, behind the parent's event loop
#: (``nice``'s own default adjustment)
DEFAULT_NICE = 10


class ProcessChildJob(WrappedJob):
    """A child running in a pool process: the ``ChildJob`` view of a ``ProcessJob``.

    ``job`` is the underlying ``zett_agent.process.ProcessJob`` (its ``status``, ``limits``,
    ``dropped_events``). ``send`` delivers ``task_message`` through the engine's host-to-job
    messages, and a brokered child's ``tokens()`` are the parent's own counts. While the job
    waits for a free process (the runner's ``max_children`` are all in use), ``info()`` says
    so: ``{"waiting": "waiting for a
    process: 256 of 256 in use"}``. A brokered child's info has ``{"broker": {"calls": N,
    "refused": M}}``: the model calls the parent made for it, and the requests it refused.
    """

    __slots__ = ("_broker", "_grace", "_pool", "job")
    job: ProcessJob

    def __init__(
        self, job: ProcessJob, pool: ProcessPool, grace: float | None, broker: Broker | None = None
    ) -> None:
        self.job = job
        self._pool = pool
        self._grace = grace
        self._broker = broker

    def __repr__(self) -> str:
        return f"<ProcessChildJob {self.job!r}>"

    def events(self) -> AsyncIterator[Any]:
        return self.job.events()

    async def cancel(self) -> None:
        """Kill the child's whole process tree.

        Returns once every process is reaped (and, for a brokered child, once the provider requests
        the parent made for it are closed).
        """
        if self._broker is not None:
            self._broker.close()  # first: no call is made for a child being stopped
        await self.job.cancel(grace=self._grace)
        if self._broker is not None:
            await self._broker.wait_closed()

    async def wait(self) -> None:
        """Wait until the child ended (and, for a brokered child, its calls too).

        Once this returns, ``tokens()`` holds the charge of every call made for the child.
        """
        await self.job.wait()
        if self._broker is not None:
            self._broker.close()  # as the job's done callback does, which may not have run yet
            await self._broker.wait_closed()

    async def send(self, message: Mapping[str, Any]) -> None:
        """Send ``message`` to the child through the engine's host-to-job messages.

        The child reads them with ``run_child``'s inbox. Raises ``RuntimeError`` unless the
        job runs.
        """
        await self.job.send(dict(message), topic=MESSAGE_TOPIC)

    def tokens(self) -> tuple[int, int] | None:
        """The tokens of the model calls the parent made for a brokered child.

        Reported usage, else estimates (``_broker_usage``); the calls under way count their
        estimate so far. ``None`` for a child that calls its model itself.
        """
        broker = self._broker
        return None if broker is None else (broker.input_tokens, broker.output_tokens)

    def on_tokens(self, callback: Callable[[int], bool]) -> None:
        if self._broker is not None:
            self._broker.on_usage = callback

    def info(self) -> Mapping[str, Any]:
        pool = self._pool
        if self.job.status is JobStatus.QUEUED and pool.running >= pool.max_workers:
            # queued behind the cap (not just for the moment a fresh process takes to fork)
            return {
                "waiting": f"waiting for a process: {pool.running} of {pool.max_workers} in use"
            }
        info: dict[str, Any] = {}
        if self._broker is not None:
            info["broker"] = self._broker.info()
        report = self.job.sandbox_report
        if report is not None:
            info["sandbox"] = sandbox_entry(report)
        egress = self.job.egress
        if egress is not None:
            info["egress"] = egress_entry(egress.counts(), egress.decisions)
        return info


#: what of a worker's sandbox report the task info shows (the parent model reads it)
_SHOWN = ("landlock_abi", "filesystem", "tcp", "scoped", "seccomp", "network", "user", "account")


def sandbox_entry(report: Mapping[str, Any]) -> dict[str, Any]:
    """The task info's ``sandbox`` entry.

    What the child's worker enforced, what is missing and, for a child that never ran, why.
    """
    entry = {key: report[key] for key in _SHOWN if key in report}
    if report.get("missing"):
        entry["missing"] = report["missing"]
    if "refused" in report:
        entry["refused"] = report["refused"]
    return entry


#: an Egress child's latest decisions the task info shows
_RECENT = 5


def egress_entry(
    counts: Mapping[str, int], decisions: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """The task info's ``egress`` entry: the counts, and the latest decisions (at most 5).

    Each decision: ``{"host", "port", "allowed", "reason", "bytes"}`` (an allowed connection
    once more when it ends, ``"reason": "closed"``, with the bytes it moved).
    """
    recent = list(decisions)[-_RECENT:]
    return {**counts, "recent": [dict(decision) for decision in recent]}


class _ExtensionPool(ProcessPool):
    """The pool a ``ProcessRunner`` creates.

    When it is garbage collected unclosed, the warning names the extension the user created, not a
    pool they never saw.
    """

    owner = "ProcessRunner"

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        owner = self.owner

        def warn(message: str, category: type[Warning], source: object = None) -> None:
            _warn(
                f"unclosed {owner}: its child processes were left to be killed at garbage "
                "collection; call 'await extension.close()' when the application shuts down, "
                f"or use 'async with {owner}(...) as extension:'",
                ResourceWarning,
                source=source,
            )

        super().__del__(warn)


class ProcessRunner:
    """Runs each child agent in its own OS process (the default runner).

    Processes come from a ``zett_agent.process.ProcessPool``: forked ahead of demand by a
    launcher process, killed with their whole process tree on cancel, timeout or close, bounded
    by the definition's ``ProcessLimits`` (all of its fields apply). The pool is created on the
    first request (``warm_up``) or the first child, in the running event loop, and closed by
    ``close()``; or it is the ``pool`` you pass, which ``close()`` leaves open (you close it).

    Args:
        pool: A ``ProcessPool`` to share (started on first use, never closed here). Its own
            ``max_workers`` and ``preload`` apply; the options below that shape a pool may not
            be combined with it.
        max_children: Global cap on children running at once, across every session
            (default ``DEFAULT_MAX_CHILDREN``, 256): a safety bound, not the CPU count. A
            child beyond it waits, and its task info says ``waiting for a process: N of N in
            use``.
        spare_processes: Processes kept forked ahead of demand (default 2).
        nice: Lower CPU priority of every child, from its fork on, and of the pool's session
            (0 to 19, default ``DEFAULT_NICE``, 10): children are the parent's background
            work, and where they and the parent's event loop want the same core, the loop goes
            first (the pool's session weighs about a tenth of the parent's; an idle parent
            leaves them every core). At 0 the children, as one session, share the CPU with the
            parent's as equals. A shared ``pool`` keeps its own (``ProcessPool``'s default: 0).
        kill_grace: Seconds between SIGTERM and SIGKILL when a child is cancelled (default:
            SIGKILL at once).
        preload: ``None`` (default): import, once in the launcher before it forks, the
            modules the children will import (their tools', models' and extensions' modules,
            the extension subclass's, the model adapters in use; never ``__main__``), as the
            extension reports them through ``warm_up``. A sequence: exactly these modules
            instead (``()`` preloads only zett_agent's own child runtime).
        preload_exclude: Modules (and packages: a name covers its submodules) never preloaded
            automatically, for modules whose import has side effects that must not happen in
            the launcher (a thread, a connection, a file opened at import time).
        broker: Broker the model calls of every child (default ``True``). A brokered child
            gets a keyless stand-in for each model whose class declares ``brokerable = True``
            (``OpenAIChatModel``, ``AnthropicModel``), its definition's or the parent's, and
            the definitions' of its own children; the parent makes the calls with the real
            model and streams the events back over the child's channel. The child needs no
            network, imports no HTTP client or SDK, never holds the key, and the provider key
            variables (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, a model's ``api_key_env``)
            are unset and wiped in it before its code is unpickled. ``broker=False``: each
            child calls its model itself (its key travels with the model or is read from the
            environment it inherited); a sandboxed child is brokered all the same. See
            ``docs/broker.md`` and ``zett_agent.runners._broker._parent`` for what is bounded.

    If an automatically found module fails to import in the launcher, the pool starts again
    without the automatic modules (a warning is logged naming the error); children then
    import what they need themselves.

    Raises:
        ValueError: a bad option, or pool-shaping options combined with ``pool``.
    """

    def __init__(
        self,
        pool: ProcessPool | None = None,
        *,
        max_children: int | None = None,
        spare_processes: int | None = None,
        kill_grace: float | None = None,
        preload: Sequence[str] | None = None,
        preload_exclude: Sequence[str] = (),
        nice: int | None = None,
        broker: bool = True,
    ) -> None:
        if pool is not None and not isinstance(pool, ProcessPool):
            raise TypeError(f"pool must be a zett_agent.process.ProcessPool, got {pool!r}")
        shaping = {
            "max_children": max_children,
            "spare_processes": spare_processes,
            "preload": preload,
            "nice": nice,
        }
        given = [name for name, value in shaping.items() if value is not None]
        if pool is not None and given:
            raise ValueError(
                f"{', '.join(given)} shape the pool this runner creates; with a shared pool, "
                "set them on the ProcessPool itself (max_workers=, spare_workers=, preload=)"
            )
        if max_children is None:
            max_children = DEFAULT_MAX_CHILDREN
        self.max_children = check_int("ProcessRunner(max_children=...)", max_children, 1)
        self.spare_processes = (
            min(2, max_children)
            if spare_processes is None
            else check_int("ProcessRunner(spare_processes=...)", spare_processes, 0)
        )
        self.kill_grace = (
            None
            if kill_grace is None
            else check_seconds("ProcessRunner(kill_grace=...)", kill_grace, high=3600)
        )
        self.preload = (
            None
            if preload is None
            else check_names("ProcessRunner(preload=...)", preload, "module names")
        )
        self.preload_exclude = check_names(
            "ProcessRunner(preload_exclude=...)", preload_exclude, "module names"
        )
        self.nice = (
            DEFAULT_NICE if nice is None else check_int("ProcessRunner(nice=...)", nice, 0, 19)
        )
        check_flag("ProcessRunner(broker=...)", broker)
        self.broker = broker
        self.__shared = pool
        self.__init_runtime()

    def __init_runtime(self) -> None:
        #: the brokers of brokered children still serving (close() waits for them)
        self.__brokers: set[Broker] = set()
        self.__own: ProcessPool | None = None
        self.__closing_pool: ProcessPool | None = None
        self.__wanted: dict[str, None] = {}
        self.__lock: asyncio.Lock | None = None
        self.__warming: asyncio.Task[None] | None = None
        #: the model classes whose ``warm_up()`` was started (``warm_up(models=...)``), and the
        #: tasks awaiting them (cancelled by ``close()``: they are only ahead of time)
        self.__models_warmed: set[type] = set()
        self.__models_warming: set[asyncio.Task[None]] = set()
        self.__closed = False
        #: named in the warning for an unclosed pool; the extension sets it to its own name
        self.owner = "ProcessRunner"

    def __repr__(self) -> str:
        pool = self.__shared or self.__own
        state = "closed" if self.__closed else "started" if pool is not None else "new"
        return f"<ProcessRunner {state} max_children={self.max_children}>"

    # A runner travels inside a definition when a child starts children of its own: only its
    # configuration goes; the child creates its own pool on first use.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "max_children": self.max_children,
            "spare_processes": self.spare_processes,
            "kill_grace": self.kill_grace,
            "preload": self.preload,
            "preload_exclude": self.preload_exclude,
            "nice": self.nice,
            "broker": self.broker,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("broker", False)
        self.__dict__.update(state)
        self.__shared = None
        self.__init_runtime()

    @property
    def pool(self) -> ProcessPool | None:
        """The pool children run in, once there is one (the shared pool, or the own one)."""
        return self.__shared or self.__own

    # -- ChildRunner ------------------------------------------------------------------------

    def warm_up(self, modules: Iterable[str] = (), *, models: Iterable[object] = ()) -> None:
        """Start the pool in the background, preloading ``modules`` (see ``preload``).

        With ``broker``, also warm up in this process the brokerable ``models`` among
        ``models`` (the children's, which this process will call for them): each one's
        ``warm_up()`` (``zett_agent.runners._broker._parent``), once per model class, beside
        the pool's start. The subagent extensions pass them.
        """
        if self.__closed:
            return
        if self.__own is None and self.__warming is None:
            for name in modules:
                if name not in self.__wanted and not excluded(name, self.preload_exclude):
                    self.__wanted[name] = None
        loop = asyncio.get_running_loop()
        if self.__warming is None and (self.__shared is not None or self.__own is None):
            self.__warming = loop.create_task(self.__warm())
        cold = self.__cold_models(models) if self.broker else []
        if cold:
            task = loop.create_task(self.__warm_models(cold))
            self.__models_warming.add(task)
            task.add_done_callback(self.__models_warming.discard)

    def __cold_models(self, models: Iterable[object]) -> list[object]:
        """The brokerable ``models`` of classes not warmed up yet (now marked as warmed)."""
        cold = []
        for model in models:
            kind = type(model)
            if getattr(kind, "brokerable", False) is True and kind not in self.__models_warmed:
                self.__models_warmed.add(kind)
                cold.append(model)
        return cold

    async def __warm(self) -> None:
        try:
            await self.__pool()
        except Exception:
            # The first real submit starts the pool again and reports the error to its caller.
            log.debug("warming up the process pool failed", exc_info=True)

    @staticmethod
    async def __warm_models(models: Sequence[object]) -> None:
        from zett_agent.runners._broker._parent import warm_up_models

        await warm_up_models(models)

    async def submit(
        self,
        spec: ChildSpec,
        *,
        limits: ProcessLimits | None = None,
        sandbox: Sandbox | None = None,
    ) -> ProcessChildJob:
        """Start ``run_child(spec)`` in a pool process.

        Returns at once (after the pool's first start). The child waits for a process if
        ``max_children`` are busy.

        A brokered child (every child by default; with ``broker=False``, ``spec.broker``, a
        sandboxed child, or any child of a process that got its own models through a broker)
        is shipped with keyless stand-ins for its brokerable models, and the parent serves
        their calls (see ``zett_agent.runners._broker._parent``).

        ``sandbox`` confines the child's whole process (its model loop included) as
        ``ProcessPool.submit`` says; the job's ``info()`` then has a ``sandbox`` entry with what
        its worker enforced.

        Raises ``TypeError`` naming the part of the spec that cannot be pickled, ``ValueError``
        for a sandbox this host cannot give (see ``ProcessPool.submit``), and ``RuntimeError``
        once closed.
        """
        pool = await self.__pool()
        target: Any = run_child
        argument: Any = spec
        models: list[Any] = []
        try:
            # a sandboxed child never holds its model's key: its calls go through this process
            options: dict[str, Any] = {}
            if spec.broker or self.broker or sandbox is not None or _relaying():
                from zett_agent.runners._broker._keys import key_variables
                from zett_agent.runners._broker._parent import pickle_brokered

                target = run_pickled_child
                try:
                    argument, models = pickle_brokered(spec)
                except Exception as exc:  # cloudpickle raises more than TypeError
                    raise TypeError(f"{type(exc).__name__}: {exc}") from exc
                options["forget"] = key_variables(models)
            try:
                job = pool.submit(target, argument, limits=limits, sandbox=sandbox, **options)
            except PoolClosed:
                if self.__shared is not None or self.__closed:
                    raise
                # our own pool lost its launcher (killed from outside): start a new one
                pool = await self.__replace(pool)
                job = pool.submit(target, argument, limits=limits, sandbox=sandbox, **options)
        except TypeError as exc:
            part = unpicklable_part(spec) or str(exc)
            raise TypeError(
                f"cannot start a child of {spec.definition.name!r}: {part}. Everything a child "
                "needs is sent to its process with cloudpickle: keep locks, clients, "
                "connections and event loops out of what the definition holds (create them in "
                "the child, inside the tool or the model), or define the class in an "
                "importable module"
            ) from exc
        if target is run_pickled_child:
            # it unset its key variables for good: a later job in its worker may need them
            retire_worker(job)
        broker = self.__serve(job, models) if models else None
        return ProcessChildJob(job, pool, self.kill_grace, broker)

    def __serve(self, job: ProcessJob, models: list[Any]) -> Broker:
        """A broker for ``job``'s calls; kept until its last call ended after the job did."""
        from zett_agent.runners._broker._parent import Broker

        broker = Broker(job, models, on_idle=self.__brokers.discard)
        self.__brokers.add(broker)
        set_event_filter(job, broker.accept)
        job.add_done_callback(broker.close)  # every open call is cancelled: its request closes
        return broker

    async def close(self) -> None:
        """Close the runner.

        Close the pool this runner created, killing whatever still runs in it (a shared
        pool stays open), and wait until every provider request made for a brokered child is
        closed. Idempotent. A pool still starting is waited for, then closed.
        """
        self.__closed = True
        for task in self.__models_warming:
            task.cancel()  # ahead of time only: a model's warm-up that hangs must not hold this
        await asyncio.gather(
            *filter(None, (self.__warming, *self.__models_warming)), return_exceptions=True
        )
        if self.__lock is not None:
            async with self.__lock:
                pass  # a start in progress has finished (or failed) once the lock is free
        if self.__own is not None:
            self.__closing_pool, self.__own = self.__own, None
        if self.__closing_pool is not None:
            # every caller returns once it is closed (a pool's close is shared by its callers)
            await self.__closing_pool.close()
        for broker in list(self.__brokers):
            broker.close()
            await broker.wait_closed()

    async def __aenter__(self) -> ProcessRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the pool ---------------------------------------------------------------------------

    async def __pool(self) -> ProcessPool:
        if self.__closed:
            raise RuntimeError("this extension is closed; create a new one to start tasks")
        if self.__shared is not None:
            await self.__shared.start()  # no-op once started; the application still closes it
            return self.__shared
        if self.__own is None:
            if self.__lock is None:
                self.__lock = asyncio.Lock()
            async with self.__lock:
                if self.__closed:
                    raise RuntimeError("this extension is closed; create a new one to start tasks")
                if self.__own is None:
                    self.__own = await self.__start_own()
        return self.__own

    async def __replace(self, broken: ProcessPool) -> ProcessPool:
        assert self.__lock is not None
        async with self.__lock:
            if self.__own is broken:
                log.warning("%s: the process pool's launcher died; starting a new pool", self.owner)
                self.__own = None
                await broken.close()
                self.__own = await self.__start_own()
        return await self.__pool()

    async def __start_own(self) -> ProcessPool:
        chosen = list(self.__wanted) if self.preload is None else list(self.preload)
        extra = [name for name in chosen if name not in RUNTIME_MODULES]
        if self.broker:
            extra += [name for name in _BROKER_MODULES if name not in extra]
        try:
            return await self.__new_pool((*RUNTIME_MODULES, *extra))
        except ProcessError as exc:
            if not extra or self.preload is not None:
                raise
            log.warning(
                "%s: preloading the children's modules failed (%s); starting the pool without "
                "them (children import them themselves). To skip a module with import side "
                "effects, pass ProcessRunner(preload_exclude=[...]).",
                self.owner,
                exc,
            )
            return await self.__new_pool(RUNTIME_MODULES)

    async def __new_pool(self, preload: Sequence[str]) -> ProcessPool:
        pool = _ExtensionPool(
            max_workers=self.max_children,
            spare_workers=min(self.spare_processes, self.max_children),
            kill_grace=self.kill_grace or 0.0,
            preload=preload,
            nice=self.nice,
            # the launcher runs a child once before it forks: what a child's first run writes
            # is then in pages every child shares (see ``rehearse``)
            warm_up=f"{rehearse.__module__}:{rehearse.__name__}",
        )
        pool.owner = self.owner
        await pool.start()
        return pool


if TYPE_CHECKING:  # both satisfy the runner interface
    from zett_agent.runners._base import ChildJob, ChildRunner

    def _check(runner: ProcessRunner, job: ProcessChildJob) -> tuple[ChildRunner, ChildJob]:
        return runner, job


def warming(runner: ProcessRunner) -> asyncio.Future[Any] | None:
    """What ``runner`` does in the background since ``warm_up``, if it started.

    Its pool's start, together with the warm-ups still under way of the models it was told
    of. For the runners' own modules, the tests and the benchmarks: the runner keeps them
    name-mangled, so a subclass's attributes never collide with them.
    """
    task: asyncio.Task[None] | None = vars(runner)["_ProcessRunner__warming"]
    models: set[asyncio.Task[None]] = vars(runner)["_ProcessRunner__models_warming"]
    if task is None or not models:
        return task
    return asyncio.gather(task, *models)
