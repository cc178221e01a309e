"""``AsyncSubAgentExtension``: background child agents, each in its own OS process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from zett_agent._checks import check_flag, check_int, check_seconds, described
from zett_agent.extensions._definition import SubAgentDefinition
from zett_agent.extensions._subagent import ChildAgentExtension, child_core
from zett_agent.extensions._tasks._store import TaskStore
from zett_agent.extensions._tasks._task import (
    SubAgentTask,
    SubAgentTaskInfo,
    SubAgentTaskStatus,
    describe,
)
from zett_agent.extensions._tasks._task_guard import Chores, TaskGuard, observe
from zett_agent.extensions._tasks._task_journal import TaskJournal
from zett_agent.extensions._tasks._task_mail import TaskMail
from zett_agent.extensions._tasks._task_messages import MessageState
from zett_agent.extensions._tasks._task_notices import TaskNotices, completion_text, stall_text
from zett_agent.extensions._tasks._task_registry import TaskRegistry
from zett_agent.extensions._tasks._task_resume import TaskResumer
from zett_agent.extensions._tasks._task_start import TaskStarter
from zett_agent.extensions._tasks._task_tools import (
    TaskAccess,
    distinct,
    extra_tools_option,
    task_tools,
    wait_for,
)
from zett_agent.extensions._tasks._task_watch import TaskWatch
from zett_agent.tools import AgentTool

if TYPE_CHECKING:
    from zett_agent._model import ModelRequest
    from zett_agent._runtime._agent import Agent
    from zett_agent.agent import AgentRunContext
    from zett_agent.process import ProcessLimits, ProcessPool, Sandbox
    from zett_agent.runners import ChildRunner

#: Default ``stall_seconds``: a running task without a sign of work for this long stalled.
DEFAULT_STALL_SECONDS = 120.0
#: Default ``max_resumes``: how often a durable task resumes after its child died.
DEFAULT_MAX_RESUMES = 2


class AsyncSubAgentExtension(ChildAgentExtension):
    """Run subagents in the background and let the model manage them with tools.

    Registers ``task_start``, ``task_list``, ``task_status``, ``task_output`` and
    ``task_cancel``. Every child is an ordinary agent with its own session, running in its own
    OS process (the default ``ProcessRunner``): a child that spins, leaks memory or crashes
    cannot stall or crash the parent, and cancelling a task kills its whole process tree
    before the task reads ``cancelled``.

    Tasks live in memory and are visible only to the session that started them. Up to
    ``max_concurrent`` tasks per session run at once, each in its own process at once,
    whatever the number of cores: sessions never wait for each other (the only global bound is
    the runner's ``max_children`` safety cap, 256 by default; a task waiting on it says so in
    its info). A finished task is announced once, as an ``AgentMessage``, before the next model
    call of a running request or when the session's next request starts; a task whose result
    the model already read (``task_output`` or ``task_cancel`` after it finished) is not
    announced. Call ``close()`` (or use ``async with``) when the application shuts down.

    The registry is bounded as a whole, not only per session:

    - **Idle sessions are forgotten** beyond ``max_sessions``, least recently used first (a
      request of the session, a task started, read or listed counts as a use). Idle means
      nothing running, nothing starting and no completion notice owed: a session with work in
      progress or a report the parent was not told about yet is never forgotten. Its task ids
      then read as forgotten (``get_task`` says why), and the session starts afresh when it
      starts a task again.
    - **Closing an agent** (``Agent.close()``, ``AgentClient.close()``, leaving ``async with``)
      **releases the sessions it ran**: their running tasks are cancelled (each child's whole
      process tree killed, as ``task_cancel`` does) and their records forgotten, before
      ``close()`` returns; a request of that agent still running can start no new task. A
      session that another open agent sharing this extension also ran stays, until the last
      of them closes. So keep an agent (and its clients) open for as long as its sessions'
      background work should run: one agent for the application's lifetime, closed at
      shutdown, as in ``docs/_examples/fastapi_app.py``, not one closed per request.

    The extension object never travels to a child: a child receives its definition, its model,
    its session id and its prompt, plus this class and ``child_state()`` when ``_create_child``
    is overridden (that method runs in the child; see its docstring).

    Talking to running children (opt-in; ``docs/steering.md`` has the whole story):

    - ``extra_tools=("task_wait", "task_message")`` gives the model two more tools, after the
      five: ``task_wait`` waits for any or all of several tasks, ``task_message`` sends a
      running task a message it reads before its next model call (or, with ``interrupt``,
      that steers its running request), confirmed by the child. From code: ``wait_any``,
      ``wait_all`` and ``send``.
    - Every task's info has ``idle_seconds`` (since the child's last sign of work); beyond
      ``stall_seconds`` it says ``"needs_attention": true`` and the parent is told once, as
      with a completion notice (``stall_notice``, ``task_stalled``).
    - ``SubAgentDefinition(token_budget=N)`` and ``session_token_budget=N`` stop children
      whose tokens go past their budget: the child's tree is killed and the task fails with
      ``token budget exceeded (used U of N tokens)``.
    - ``store=PATH`` keeps the registry in a sqlite file (``TaskStore``): after a restart the
      earlier tasks are there again, those that were running as ``failed`` with ``"lost":
      true``, and notices not yet delivered are delivered once.
    - ``durable=True`` (with ``store=``) journals each child's steps in the store and resumes
      a task whose child died, or whose host stopped, from where it stopped, without asking
      the model again for a step it answered or running again a tool call it finished
      (``docs/steering.md``, "Durable tasks"); ``extra_tools=("task_resume",)`` lets the
      model continue a finished task with a follow-up (``resume``).

    Args:
        subagents: Profiles the parent may choose; default the built-in ``reasoning`` and
            ``explore`` profiles on the parent's model.
        max_concurrent: Running tasks allowed per session at once (starting ones included).
        max_retained: Finished tasks kept per session, at all times; the oldest finished are
            forgotten first. A task forgotten before its notice was delivered is announced
            with a short form of its report (it can no longer be read with ``task_output``).
        max_sessions: Idle sessions kept (nothing running or starting, no notice owed), at
            all times; the least recently used are forgotten first. Sessions with work in
            progress or a notice owed are always kept, and do not count against it (with
            ``notify_parent=False`` no notice is owed: a session whose tasks all finished is
            idle).
        notify_parent: Announce finished tasks to the parent.
        runner: Where children run: a ``zett_agent.runners.ChildRunner``. Default
            ``ProcessRunner()`` (a process per child); ``InProcessRunner()`` runs them as
            asyncio tasks (no hard kill, no isolation; for development without the engine).
            The extension closes it in ``close()``.
        limits: Default ``ProcessLimits`` for definitions that set none.
        pool: Shortcut for ``runner=ProcessRunner(pool)``: a ``ProcessPool`` to share (started
            on first use, left open by ``close()``).
        kill_grace: Shortcut for ``ProcessRunner(kill_grace=...)``: seconds between SIGTERM
            and SIGKILL when cancelling (default: SIGKILL at once).
        max_children: Shortcut for ``ProcessRunner(max_children=...)``: the global cap on
            children running at once across every session (default 256). ``max_workers`` is
            its older name.
        sandbox: Default ``zett_agent.process.Sandbox`` for definitions that set none: each
            such child's whole process is confined (files, network, environment, account)
            before any of its code runs, and ``task_info`` has a ``sandbox`` entry saying what
            was enforced (``{"landlock_abi": 7, "seccomp": true, "user": 65534, "network":
            "none", ...}``). A required sandbox that cannot be enforced fails the task with
            ``SandboxUnavailable`` before the child runs.
        extra_tools: Tools the model gets besides the five, by name: ``"task_wait"``,
            ``"task_message"`` (default none). ``build_tools`` returns them after the five.
        stall_seconds: Seconds without a sign of work after which a running task stalled
            (default 120); ``None`` turns stall detection off.
        session_token_budget: Input plus output tokens all the tasks of one session may use
            (default: no limit). Once spent, its running tasks are stopped (each child's tree
            killed, the task failed) and ``task_start`` is refused.
        store: Keep the registry in a sqlite3 file across restarts: a path, or a
            ``TaskStore`` (default: memory only). Opened here: ``TaskStoreError`` if another
            live host holds it, or the file is damaged, not a task store, or newer (a file
            of an older version is upgraded in place).
        durable: Journal each child's steps in ``store`` and resume its task after the
            child's death (a crash, a signal, the memory limit, a lost Ray node; up to
            ``max_resumes`` times) and after a restart of the host (at the session's next
            request), in a new child that goes on from its journal. Tool calls are then
            at-least-once: a call started but not recorded done runs again on resume, with
            the same ``tool_context().idempotency_key``. A cancel, a timeout and a budget stop
            are never resumed; ``close()`` (and closing an agent) suspends the running tasks
            instead of cancelling them: the next extension on the store resumes them. Needs
            ``store=`` and definitions that can be pickled (``TypeError`` at ``task_start``).
        max_resumes: How often a durable task resumes after its child died, since it started
            or was followed up (default 2; 0: never). After the last try the failure stands,
            with each try's death in its info (``deaths``).

    Raises:
        TypeError, ValueError: a bad option (the message names it).
        TaskStoreError: the store cannot be used (the message names the file and why).
    """

    def __init__(
        self,
        subagents: Sequence[SubAgentDefinition] | None = None,
        *,
        max_concurrent: int = 4,
        max_retained: int = 100,
        max_sessions: int = 1000,
        notify_parent: bool = True,
        runner: ChildRunner | None = None,
        limits: ProcessLimits | None = None,
        pool: ProcessPool | None = None,
        kill_grace: float | None = None,
        max_children: int | None = None,
        max_workers: int | None = None,
        sandbox: Sandbox | None = None,
        extra_tools: Iterable[str] = (),
        stall_seconds: float | None = DEFAULT_STALL_SECONDS,
        session_token_budget: int | None = None,
        store: str | os.PathLike[str] | TaskStore | None = None,
        durable: bool = False,
        max_resumes: int = DEFAULT_MAX_RESUMES,
    ) -> None:
        extras = extra_tools_option(extra_tools)
        cls = type(self).__name__
        check_flag(f"{cls}(durable=...)", durable)
        check_int(f"{cls}(max_resumes=...)", max_resumes, 0, 100)
        if durable and store is None:
            raise ValueError(
                f"{cls}(durable=True) needs a store: the journal of each task lives in it. "
                f"Write {cls}(..., store='tasks.sqlite', durable=True)"
            )
        if "task_resume" in extras and not durable:
            raise ValueError(
                'extra_tools=("task_resume",) continues a task from its journal, which only '
                f"durable tasks have: add durable=True (and store=...) to {cls}(...)"
            )
        if stall_seconds is not None:
            check_seconds(f"{cls}(stall_seconds=...)", stall_seconds, above=True)
        if session_token_budget is not None:
            check_int(f"{cls}(session_token_budget=...)", session_token_budget, 1)
        if store is not None and not isinstance(store, (TaskStore, str, os.PathLike)):
            raise TypeError(
                f"{cls}(store=...) must be a path or a TaskStore, got {described(store)}; write "
                "store='tasks.sqlite'"
            )
        check_int(f"{cls}(max_concurrent=...)", max_concurrent, 1)
        check_int(f"{cls}(max_retained=...)", max_retained, 0)
        check_int(f"{cls}(max_sessions=...)", max_sessions, 0)
        super().__init__(
            subagents,
            runner=runner,
            pool=pool,
            limits=limits,
            kill_grace=kill_grace,
            max_children=max_children,
            max_workers=max_workers,
            sandbox=sandbox,
        )
        self.max_concurrent = max_concurrent
        self.max_retained = max_retained
        self.max_sessions = max_sessions
        self.notify_parent = notify_parent
        #: the extra tools, in the order given
        self.extra_tools: tuple[str, ...] = extras
        self.stall_seconds: float | None = None if stall_seconds is None else float(stall_seconds)
        self.session_token_budget = session_token_budget
        self.durable = durable
        self.max_resumes = max_resumes
        self.__init_tasks()
        if store is not None:
            # restores the tasks it holds: finished ones as they were, running ones as lost
            # (failed), notices owed as owed
            counter = self.__registry.open_store(
                store, notify=self.notify_parent, render=self.__notices.render_notice
            )
            core = child_core(self)
            core.counter = max(core.counter, counter)

    def __getstate__(self) -> dict[str, Any]:
        # the tasks of this process stay here: a copy (a child's) starts with none
        prefix = "_AsyncSubAgentExtension__"
        return {k: v for k, v in super().__getstate__().items() if not k.startswith(prefix)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__init_tasks()

    def __init_tasks(self) -> None:
        # name-mangled, as the base's: a subclass's own attributes never meet these
        core = child_core(self)
        #: every session's task records, and the store that keeps them (if any)
        self.__registry = TaskRegistry(self)
        #: background work close() waits for: budget stops, hooks, message pumps
        self.__chores = Chores()
        self.__guard = TaskGuard(self, self.__registry, self.__chores)
        self.__mail = TaskMail(self, self.__registry, self.__chores)
        self.__notices = TaskNotices(self, self.__registry)
        launch = functools.partial(core.launch, self)
        self.__resumer = TaskResumer(
            self,
            self.__registry,
            self.__chores,
            launch=launch,
            follow=lambda task: self.__starter.follow(task),
            settle=self.__settle,
            closing=lambda: self.__closing,
        )
        self.__watcher = TaskWatch(
            self,
            self.__registry,
            self.__guard,
            self.__notices,
            TaskJournal(self, self.__registry, self.__chores, self.__guard),
            self.__resumer.after_death,
        )
        self.__starter = TaskStarter(
            self.__registry,
            self.__guard,
            self.__watcher,
            number=core.next_number,
            launch=launch,
            closing=lambda: self.__closing,
            durable=lambda: self.durable,
        )
        self.__closing = False
        self.__close_task: asyncio.Task[None] | None = None

    @property
    def store(self) -> TaskStore | None:
        """The ``TaskStore`` the registry is kept in (``None``: memory only)."""
        return self.__registry.store

    # ----------------------------------------------------------------- hooks

    async def on_tool(self, context: AgentRunContext) -> None:
        """Register the task tools for this request (and boot the process pool if needed).

        A durable task its host was running when it stopped resumes here, at its session's
        first request since.
        """
        self.__registry.use(context.session_id, context.agent)
        child_core(self).warm_up(self, context.model)
        if self.__registry.store is not None and not self.__closing:
            await self.__resumer.resume_waiting(context)
        for tool in self.build_tools(context, self.subagents):
            context.register_tool(tool)

    async def on_state(self, context: AgentRunContext) -> None:
        """Announce tasks that finished (or stalled) while no request was active."""
        await self.__notices.announce(context)

    async def before_model(self, context: AgentRunContext, request: ModelRequest) -> None:
        """Announce tasks that finished (or stalled) since the previous model call."""
        await self.__notices.announce(context)

    # -------------------------------------------------------------- registry

    def tasks(self, session_id: str) -> tuple[SubAgentTask, ...]:
        """Return the tasks one session started, oldest first (none once it was forgotten)."""
        session = self.__registry.use(session_id)
        return tuple(session.tasks.values()) if session else ()

    def get_task(self, session_id: str, task_id: str) -> SubAgentTask:
        """Return one task of a session.

        Raises:
            ValueError: If the session has no such task. The message lists the known ids (and
                says so when the task was forgotten: because of ``max_retained``, or with its
                whole session, idle beyond ``max_sessions`` or released when its agent closed).
        """
        return self.__registry.find(session_id, task_id)

    async def on_agent_closed(self, agent: Agent, session_ids: frozenset[str]) -> None:
        """Release the sessions ``agent`` ran that no other open agent uses.

        Cancel their running tasks (killing each child's tree), wait for them to settle, forget
        them. A durable task is suspended instead (its store keeps it running): an extension
        opened on the store later resumes it.
        """
        await self.__registry.release(agent, session_ids, self.__suspend)

    # ------------------------------------------------------------- lifecycle

    async def start(
        self,
        context: AgentRunContext,
        definition: SubAgentDefinition,
        *,
        description: str,
        prompt: str,
    ) -> SubAgentTask:
        """Start one background task and return it while it runs.

        The ``max_concurrent`` slot is reserved before anything is awaited, so parallel calls
        never start more than ``max_concurrent`` tasks of a session.

        Raises:
            ValueError: If the session already runs ``max_concurrent`` tasks (the message lists
                them), its ``session_token_budget`` is spent, or the prompt is empty.
            TypeError: If the definition cannot be shipped to the child (the message names the
                part that cannot be pickled). Nothing is registered.
            RuntimeError: If the extension is closed, or the agent of ``context`` is (closing
                it released the session; see the class docstring), or the store could not
                write the task (its child was not started then).

        With a ``store``, the task is written before this returns.
        """
        if self.__closing:
            raise RuntimeError("AsyncSubAgentExtension is closed; no new tasks can start")
        if getattr(context.agent, "closed", False):
            raise RuntimeError(
                "the agent is closed, which released this session's background tasks; no new "
                "task can start from it (use an open agent)"
            )
        if not prompt.strip():
            raise ValueError("prompt is empty; give the task the full instructions to work on")
        task = await self.__starter.start(context, definition, description, prompt)
        await observe(self.task_started, task)
        return task

    async def wait(self, task: SubAgentTask, timeout: float | None = None) -> SubAgentTask:  # noqa: ASYNC109 (the seed's signature)
        """Wait until a task finishes or ``timeout`` seconds pass, then return it.

        Cancelling the caller does not cancel the task.
        """
        if not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task.settled.wait(), timeout)
        return task

    async def wait_any(
        self,
        tasks: Iterable[SubAgentTask],
        timeout: float | None = None,  # noqa: ASYNC109 (the issue's signature, as wait's)
    ) -> list[SubAgentTask]:
        """Wait until one of ``tasks`` finished or ``timeout`` seconds passed.

        Returns those of them that finished by then (in the order given; empty after a
        timeout).

        Cancelling the caller cancels none of the tasks.

        Raises:
            ValueError: ``tasks`` is empty (nothing could ever finish).
        """
        chosen = distinct(tasks)
        if not chosen:
            raise ValueError("wait_any() needs at least one task")
        await wait_for(chosen, every=False, seconds=timeout)
        return [t for t in chosen if t.done()]

    async def wait_all(
        self,
        tasks: Iterable[SubAgentTask],
        timeout: float | None = None,  # noqa: ASYNC109 (the issue's signature, as wait's)
    ) -> list[SubAgentTask]:
        """Wait until every one of ``tasks`` finished or ``timeout`` seconds passed.

        Returns those that finished by then (in the order given: all of them unless it
        timed out).

        Cancelling the caller cancels none of the tasks.
        """
        chosen = distinct(tasks)
        await wait_for(chosen, every=True, seconds=timeout)
        return [t for t in chosen if t.done()]

    async def send(self, task: SubAgentTask, text: str, *, interrupt: bool = False) -> str:
        """Send a running task a message; return its ``message_id`` once it was delivered.

        The child confirms delivery once the message is in a model call's request: appended
        before its next model call, or, with ``interrupt``, steering its running request as
        ``client.steer`` does.

        Raises:
            ValueError: The task has ended (before sending, or before the child read the
                message: then it was never delivered), or the message is empty or breaks a
                bound (``MAX_MESSAGE_CHARS``, ``MAX_MESSAGES`` per task).
            TypeError: ``text`` is not a ``str``.
            NotImplementedError: The runner cannot deliver messages to its children.

        Cancellation: cancelling the caller cancels neither the task nor the message, which
        is still delivered.
        """
        record = self.__mail.queue(task, text, interrupt)
        await record.settled.wait()
        if record.state is not MessageState.DELIVERED:
            raise ValueError(
                f"task {task.task_id} ended ({task.status.value}) before it read message "
                f"{record.message_id}; it was never delivered"
            )
        return record.message_id

    async def resume(
        self, context: AgentRunContext, task: SubAgentTask, prompt: str
    ) -> SubAgentTask:
        """Continue a finished durable task with a follow-up prompt; return it while it runs.

        The task (completed, failed, cancelled, or lost after a restart) runs again under its
        own id, in a new child whose conversation is the one its journal holds, followed by
        ``prompt`` (calls it ended without are answered as skipped). Its notices, its
        ``max_concurrent`` slot and its session's budget count as for a new task; its
        ``max_resumes`` count starts again.

        Raises:
            ValueError: The task is still running, is not durable, or the prompt is empty;
                the session runs ``max_concurrent`` tasks or spent its budget.
            RuntimeError: The extension or the agent of ``context`` is closed, or the child
                could not start (the task then failed again, saying why).
        """
        if getattr(context.agent, "closed", False):
            raise RuntimeError(
                "the agent is closed; no task can resume from it (use an open agent)"
            )
        await self.__resumer.follow_up(context, task, prompt)
        await observe(self.task_started, task)
        return task

    async def cancel(self, task: SubAgentTask) -> SubAgentTask:
        """Cancel a running task and wait for it to settle; a finished task is unchanged.

        Returns once the child's whole process tree is gone. If the caller is cancelled
        meanwhile, the kill still completes in the background. A durable task is never
        resumed after a cancel.
        """
        if task.done():
            return task
        task.cancelling = True
        if task.job is not None:
            await asyncio.shield(task.job.cancel())
        elif task.watcher is None:  # a durable task waiting to resume after a restart
            await self.__settle_now(task)
        await task.settled.wait()
        return task

    async def __suspend(self, task: SubAgentTask) -> SubAgentTask:
        """Stop a task as the extension closes: a durable one is suspended, others cancelled.

        A suspended task's child is killed, but its store still says it runs: the next
        extension on the store resumes it.
        """
        if task.durable is None or task.done():
            return await self.cancel(task)
        task.suspended = task.cancelling = True
        if task.job is not None:
            await asyncio.shield(task.job.cancel())
        if task.watcher is None:
            await self.__settle_now(task)
        await task.settled.wait()
        return task

    def __settle(self, task: SubAgentTask) -> None:
        """Settle a task no watcher follows (its resume could not start), then observe it."""
        self.__watcher.settle(task)
        self.__chores.add(
            asyncio.get_running_loop().create_task(
                observe(self.task_finished, task), name=f"zett-agent-finished-{task.task_id}"
            )
        )

    async def __settle_now(self, task: SubAgentTask) -> None:
        self.__watcher.settle(task)
        await observe(self.task_finished, task)

    async def close(self) -> None:
        """Cancel every running task of every session and wait for them to settle.

        Then closes the runner: the process pool this extension created (a shared pool stays
        open), and writes out the store (closing it if it was given as a path). Nothing the
        extension started outlives this call. Idempotent. A durable task is suspended, not
        cancelled: its child is killed, its store keeps it running, and the next extension
        on the store resumes it.
        """
        if self.__close_task is None:
            self.__closing = True
            self.__close_task = asyncio.get_running_loop().create_task(self.__close())
        # every caller returns once everything is closed; a cancelled caller leaves the close
        # running in the background
        await asyncio.shield(self.__close_task)

    async def __close(self) -> None:
        # a start in flight sees ``_closing`` once its runner answered and cancels its child
        await self.__registry.stop_all(self.__suspend)
        await self.__chores.settle()
        try:
            await self.runner.close()
        finally:
            await self.__registry.close_store()

    async def __aenter__(self) -> AsyncSubAgentExtension:
        """Enter: the runner's pool starts booting now, in the background.

        When every definition has a model of its own, nothing the children import depends on
        the parent's model, so the pool (the launcher importing the child runtime and those
        modules) boots while the program goes on, and the first ``task_start`` finds it ready
        or nearly. Otherwise it boots at the first request, as without ``async with``.
        """
        if all(definition.model is not None for definition in self.subagents):
            child_core(self).warm_up(self, None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- model

    def build_tools(
        self, context: AgentRunContext, subagents: Sequence[SubAgentDefinition]
    ) -> tuple[AgentTool, ...]:
        """Return the tools to register for one request.

        Override to drop a tool, add one, or replace one, calling ``super().build_tools(...)``
        for the rest. The five come first, then the ``extra_tools`` in the order given.
        """
        return task_tools(self, self.__tool_access(), context, subagents)

    def __tool_access(self) -> TaskAccess:
        """What the task tools may do beyond the public methods (``_task_tools.TaskAccess``)."""
        return TaskAccess(
            known_ids=self.__registry.known_ids,
            mark_read=self.__notices.mark_read,
            queue_message=self.__mail.queue,
        )

    def task_info(self, task: SubAgentTask, *, include_output: bool = False) -> SubAgentTaskInfo:
        """Describe one task for the model.

        Override to add detail. ``include_output`` is true only for the tools that return a
        report by contract (``task_output``, and ``task_wait`` for the tasks that finished), so
        listings stay short.

        Besides the seed's keys: ``total_tokens`` (and ``token_budget`` when the definition
        sets one), ``idle_seconds`` and, for a running task idle beyond ``stall_seconds``,
        ``"needs_attention": true``; ``messages`` (``{"sent": n, "delivered": m}``, plus
        ``undelivered`` ids once it ended) when it was sent any; ``"lost": true`` for a task
        restored from a store that was running when its host stopped; for a durable task,
        ``resumes`` (how often it resumed: after its child died or its host restarted; 0 when
        never) and, once a try died, ``deaths``: ``[{"try": 1, "reason": "the child process
        was killed by SIGKILL"}, ...]``.
        """
        if task.job is not None and not task.done():
            task.pid = task.job.pid if task.status is SubAgentTaskStatus.RUNNING else None
            self.__guard.record_usage(task)
        return describe(task, include_output, attention=self.__guard.needs_attention(task))

    def completion_notice(self, task: SubAgentTask) -> str | None:
        """Return the message that tells the parent a task finished; ``None`` stays silent.

        The default points at ``task_output``; for a task the registry already forgot
        (``task.evicted``: more than ``max_retained`` finished before it was announced) it
        carries the report itself, cut to 2,000 characters, since it can no longer be read.
        It names the messages the task ended without reading (``task_message``).
        """
        return completion_text(task, self.max_retained)

    def stall_notice(self, task: SubAgentTask) -> str | None:
        """Return the message that tells the parent a running task stalled.

        A task stalled when it showed no sign of work for ``stall_seconds``; ``None`` stays
        silent. Delivered as a completion notice is, once per stall, and not at all if the
        task worked again (or ended) before.
        """
        return stall_text(task, self.stall_seconds, self.extra_tools)

    async def task_started(self, task: SubAgentTask) -> None:
        """Observe a task that just started; the default does nothing."""

    async def task_stalled(self, task: SubAgentTask) -> None:
        """Observe a running task that just stalled (no sign of work for ``stall_seconds``).

        The default does nothing. Errors are logged. Like ``task_finished``, the place to
        wake an idle parent with an ``InternalMessageEvent``.
        """

    async def task_finished(self, task: SubAgentTask) -> None:
        """Observe a task that reached a terminal status; the default does nothing.

        Its errors are logged, never raised into the task. Publish an ``InternalMessageEvent``
        here to wake an idle parent instead of waiting for its next request.
        """


def task_registry(extension: AsyncSubAgentExtension) -> TaskRegistry:
    """The registry of ``extension``'s tasks (for the package's own modules and its tests).

    The extension keeps it name-mangled, so a subclass's attributes never collide with it.
    """
    registry: TaskRegistry = vars(extension)["_AsyncSubAgentExtension__registry"]
    return registry
