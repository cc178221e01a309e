"""``AsyncSubAgentExtension``: background child agents, each in its own OS process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from zett_agent._messages import AgentMessage
from zett_agent._text import valid_text
from zett_agent.extensions._definition import SubAgentDefinition
from zett_agent.extensions._runner import failure_reason, report_content
from zett_agent.extensions._subagent import ChildAgentExtension, short_repr, start_schema
from zett_agent.extensions._tasks import (
    NOTICE_REPORT_CHARS,
    SessionTasks,
    SubAgentTask,
    SubAgentTaskInfo,
    SubAgentTaskStatus,
)
from zett_agent.process import JobCancelled, PoolClosed
from zett_agent.tools import AgentTool

if TYPE_CHECKING:
    from zett_agent._agent import Agent
    from zett_agent._model import ModelRequest
    from zett_agent.agent import AgentRunContext
    from zett_agent.process import ProcessLimits, ProcessPool, Sandbox
    from zett_agent.runners import ChildRunner

log = logging.getLogger(__name__)

#: Longest ``wait_seconds`` a model may ask ``task_output`` for.
MAX_WAIT_SECONDS = 600.0

#: why a session's records are gone, as ``get_task`` says it
_EVICTED = (
    "it was idle, nothing running or unread, while more than max_sessions={} idle sessions "
    "were kept"
)
_RELEASED = "the agent that ran it was closed"


def _task_id_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "task_id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 100,
                "description": "the task_id task_start returned",
            }
        },
        "required": ["task_id"],
        "additionalProperties": False,
    }


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

    Raises:
        TypeError, ValueError: a bad option (the message names it).
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
    ) -> None:
        for option, value, least in (
            ("max_concurrent", max_concurrent, 1),
            ("max_retained", max_retained, 0),
            ("max_sessions", max_sessions, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{option} must be an int, got {value!r}")
            if value < least:
                raise ValueError(f"{option} must be >= {least}, got {value}")
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

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._sessions: dict[str, SessionTasks] = {}
        #: the idle sessions (forgettable), least recently used first
        self._idle: OrderedDict[str, None] = OrderedDict()
        #: sessions whose records were forgotten, with why (the most recent ones)
        self._forgotten: OrderedDict[str, str] = OrderedDict()
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- hooks

    async def on_tool(self, context: AgentRunContext) -> None:
        """Register the task tools for this request (and boot the process pool if needed)."""
        self._use(context.session_id, context.agent)
        self._warm_up(context.model)
        for tool in self.build_tools(context, self.subagents):
            context.register_tool(tool)

    async def on_state(self, context: AgentRunContext) -> None:
        """Announce tasks that finished while no request was active."""
        self._announce(context)

    async def before_model(self, context: AgentRunContext, request: ModelRequest) -> None:
        """Announce tasks that finished since the previous model call of this request."""
        self._announce(context)

    # -------------------------------------------------------------- registry

    def tasks(self, session_id: str) -> tuple[SubAgentTask, ...]:
        """Return the tasks one session started, oldest first (none once it was forgotten)."""
        session = self._use(session_id)
        return tuple(session.tasks.values()) if session else ()

    def get_task(self, session_id: str, task_id: str) -> SubAgentTask:
        """Return one task of a session.

        Raises:
            ValueError: If the session has no such task. The message lists the known ids (and
                says so when the task was forgotten: because of ``max_retained``, or with its
                whole session, idle beyond ``max_sessions`` or released when its agent closed).
        """
        session = self._use(session_id)
        if session is not None:
            task = session.tasks.get(task_id)
            if task is not None:
                return task
            if task_id in session.evicted:
                raise ValueError(
                    f"task {task_id!r} finished and was evicted (only the last "
                    f"{self.max_retained} finished tasks are kept); start it again if needed"
                )
        why = self._forgotten.get(session_id) if session is None else session.forgotten_before
        if why is not None:
            earlier = "this session's" if session is None else "this session's earlier"
            raise ValueError(
                f"task {task_id!r} is not known any more: {earlier} task records were "
                f"forgotten ({why}); start it again if needed"
            )
        known = ", ".join(self._known_ids(session_id)) or "none"
        raise ValueError(f"unknown task_id {task_id!r}; this session's tasks are: {known}")

    def _known_ids(self, session_id: str) -> list[str]:
        session = self._sessions.get(session_id)
        return list(session.tasks) if session else []

    def _session(self, session_id: str) -> SessionTasks:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = SessionTasks(self.max_retained)
            session.forgotten_before = self._forgotten.pop(session_id, None)
        return session

    def _use(self, session_id: str, agent: Agent | None = None) -> SessionTasks | None:
        """The session's records, marked as just used (and used by ``agent``); ``None`` if it
        has none. Creates nothing."""
        session = self._sessions.get(session_id)
        if session is not None:
            if agent is not None:
                session.users.add(agent)
            if session_id in self._idle:
                self._idle.move_to_end(session_id)
        return session

    def _refresh(self, session_id: str, session: SessionTasks) -> None:
        """After a change of what the session runs or owes: file it as idle (most recently
        used) or not, then forget the least recently used idle sessions beyond
        ``max_sessions``."""
        if self._sessions.get(session_id) is not session:
            return  # forgotten meanwhile
        if session.idle and not session.released:
            self._idle[session_id] = None
            self._idle.move_to_end(session_id)
        else:
            self._idle.pop(session_id, None)
        while len(self._idle) > self.max_sessions:
            oldest, _ = self._idle.popitem(last=False)
            self._forget(oldest, _EVICTED.format(self.max_sessions))

    def _forget(self, session_id: str, why: str) -> None:
        session = self._sessions.pop(session_id, None)
        self._idle.pop(session_id, None)
        if session is None:
            return
        for task in session.tasks.values():
            task.evicted = True
        self._forgotten[session_id] = why
        self._forgotten.move_to_end(session_id)
        while len(self._forgotten) > max(self.max_sessions, 1000):
            self._forgotten.popitem(last=False)

    async def _agent_closed(self, agent: Agent, session_ids: frozenset[str]) -> None:
        """Release the sessions ``agent`` ran that no other open agent uses: cancel their
        running tasks (killing each child's tree), wait for them to settle, forget them."""
        released = []
        for session_id in session_ids:
            session = self._sessions.get(session_id)
            if session is None:
                continue
            session.users.discard(agent)
            if not session.users:
                released.append(session_id)
        if released:
            await asyncio.gather(*(self._release(s) for s in released))

    async def _release(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is None or session.released:
            return
        session.released = True  # from here on no task starts in it
        self._idle.pop(session_id, None)
        try:
            await session.no_starts.wait()  # a start in flight cancels its own child
            running = session.running()
            if running:
                await asyncio.gather(*(self.cancel(t) for t in running))
            watchers = [t.watcher for t in session.tasks.values() if t.watcher is not None]
            await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            if self._sessions.get(session_id) is session:
                self._forget(session_id, _RELEASED)

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
                them) or the prompt is empty.
            TypeError: If the definition cannot be shipped to the child (the message names the
                part that cannot be pickled). Nothing is registered.
            RuntimeError: If the extension is closed, or the agent of ``context`` is (closing
                it released the session; see the class docstring).
        """
        if self._closing:
            raise RuntimeError("AsyncSubAgentExtension is closed; no new tasks can start")
        if getattr(context.agent, "closed", False):
            raise RuntimeError(
                "the agent is closed, which released this session's background tasks; no new "
                "task can start from it (use an open agent)"
            )
        if not prompt.strip():
            raise ValueError("prompt is empty; give the task the full instructions to work on")
        session = self._session(context.session_id)
        if session.released:
            raise RuntimeError(
                "this session is being released (the agent that ran it was closed); no new "
                "task can start in it until that is done"
            )
        session.users.add(context.agent)
        running = session.running()
        if len(running) + session.starting >= self.max_concurrent:
            listing = ", ".join(
                f"{t.task_id} ({t.subagent_type}, {t.status.value})" for t in running
            )
            if session.starting:
                listing += f"{', ' if listing else ''}{session.starting} starting"
            raise ValueError(
                f"this session already runs {len(running) + session.starting} tasks "
                f"(max_concurrent={self.max_concurrent}): {listing}. Wait for one with "
                "task_output or stop one with task_cancel, then start again."
            )
        self._counter += 1
        task_id = f"task-{self._counter}"
        task = SubAgentTask(
            task_id=task_id,
            parent_session_id=context.session_id,
            session_id=f"{context.session_id}/{task_id}",
            subagent_type=definition.name,
            description=description,
            prompt=prompt,
        )
        session.starting += 1  # the slot is taken from here on, across the await below
        session.no_starts.clear()
        self._refresh(context.session_id, session)
        try:
            self._warm_up(context.model)
            spec = self._child_spec(
                context.model, definition, session_id=task.session_id, prompt=prompt
            )
            job = await self._submit(spec, definition)
            if self._closing or session.released:  # closing began while the runner started
                await job.cancel()
                what = (
                    "AsyncSubAgentExtension was closed"
                    if self._closing
                    else "this session was released (the agent that ran it was closed)"
                )
                raise RuntimeError(f"{what} while the task started; it did not start")
            task.job = job
            session.add(task)
        finally:
            session.starting -= 1
            if not session.starting:
                session.no_starts.set()
            self._refresh(context.session_id, session)
        task.watcher = asyncio.get_running_loop().create_task(
            self._watch(task), name=f"zett-agent-{task_id}"
        )
        await self._observe(self.task_started, task)
        return task

    async def _watch(self, task: SubAgentTask) -> None:
        """Fold the child's progress into the task, then settle it from the job's outcome."""
        job = task.job
        assert job is not None
        try:
            async for event in job.events():
                if task.status is SubAgentTaskStatus.PENDING:
                    task.transition(SubAgentTaskStatus.RUNNING)
                task.pid = job.pid
                task.fold_progress(event)
            await job.wait()
        finally:
            # Whatever happened above (even this watcher being cancelled), the task settles.
            self._settle(task)
        await self._observe(self.task_finished, task)

    def _settle(self, task: SubAgentTask) -> None:
        if task.done():
            return
        job = task.job
        error: BaseException | None
        if job is None or not job.done():
            error = RuntimeError("the task's supervisor stopped before the child finished")
        else:
            error = job.exception()
            self._record_usage(task)
        if error is None:
            assert job is not None
            task.output = report_content(job.result())
            task.transition(SubAgentTaskStatus.COMPLETED)
        elif isinstance(error, (JobCancelled, PoolClosed)):
            task.error = failure_reason(error)
            task.transition(SubAgentTaskStatus.CANCELLED)
        else:
            task.error = failure_reason(error)
            task.transition(SubAgentTaskStatus.FAILED)
        session = self._sessions.get(task.parent_session_id)
        if session is not None and session.tasks.get(task.task_id) is task:
            session.finish(task, notify=self.notify_parent, render=self._render_notice)
            self._refresh(task.parent_session_id, session)

    def _record_usage(self, task: SubAgentTask) -> None:
        if task.job is None:
            return
        try:
            usage = task.job.usage()
        except Exception:  # usage is a nicety; never let it break settling
            log.debug("could not read usage of %s", task.task_id, exc_info=True)
            return
        task.cpu_seconds = usage.cpu_seconds
        task.peak_memory_bytes = max(task.peak_memory_bytes, usage.peak_rss_bytes)

    async def _observe(
        self, hook: Callable[[SubAgentTask], Awaitable[None]], task: SubAgentTask
    ) -> None:
        try:
            await hook(task)
        except Exception:
            log.exception("%s(%s) raised; ignored", getattr(hook, "__name__", hook), task.task_id)

    async def wait(self, task: SubAgentTask, timeout: float | None = None) -> SubAgentTask:  # noqa: ASYNC109 (the seed's signature)
        """Wait until a task finishes or ``timeout`` seconds pass, then return it.

        Cancelling the caller does not cancel the task.
        """
        if not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task.settled.wait(), timeout)
        return task

    async def cancel(self, task: SubAgentTask) -> SubAgentTask:
        """Cancel a running task and wait for it to settle; a finished task is unchanged.

        Returns once the child's whole process tree is gone. If the caller is cancelled
        meanwhile, the kill still completes in the background.
        """
        if task.done():
            return task
        if task.job is not None:
            await asyncio.shield(task.job.cancel())
        await task.settled.wait()
        return task

    async def close(self) -> None:
        """Cancel every running task of every session and wait for them to settle.

        Then closes the runner: the process pool this extension created (a shared pool stays
        open). Nothing the extension started outlives this call. Idempotent.
        """
        if self._close_task is None:
            self._closing = True
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        # every caller returns once everything is closed; a cancelled caller leaves the close
        # running in the background
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        # a start in flight sees ``_closing`` once its runner answered and cancels its child
        await asyncio.gather(*(s.no_starts.wait() for s in list(self._sessions.values())))
        running = [t for s in self._sessions.values() for t in s.running()]
        if running:
            await asyncio.gather(*(self.cancel(t) for t in running))
        watchers = [t.watcher for s in self._sessions.values() for t in s.tasks.values()]
        await asyncio.gather(*(w for w in watchers if w is not None), return_exceptions=True)
        await self._runner.close()

    async def __aenter__(self) -> AsyncSubAgentExtension:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- model

    def build_tools(
        self, context: AgentRunContext, subagents: Sequence[SubAgentDefinition]
    ) -> tuple[AgentTool, ...]:
        """Return the tools to register for one request.

        Override to drop a tool, add one, or replace one, calling ``super().build_tools(...)``
        for the rest.
        """
        session_id = context.session_id
        profiles = "; ".join(f"{d.name}: {d.description}" for d in subagents)
        by_name = {d.name: d for d in subagents}

        async def task_start(subagent_type: str, description: str, prompt: str) -> str:
            definition = by_name.get(subagent_type)
            if definition is None:
                known = ", ".join(repr(n) for n in by_name)
                raise ValueError(
                    f"unknown subagent_type {short_repr(subagent_type)}; choose one of: {known}"
                )
            task = await self.start(context, definition, description=description, prompt=prompt)
            info = self.task_info(task)
            info.setdefault(
                "hint",
                "running in the background; keep working, then read it with task_output",
            )
            return _json(info)

        async def task_list() -> str:
            tasks = self.tasks(session_id)
            return _json({"tasks": [self.task_info(t) for t in tasks]})

        async def task_status(task_id: str) -> str:
            return _json(self.task_info(self.get_task(session_id, task_id)))

        async def task_output(task_id: str, wait_seconds: float = 0) -> str:
            if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
                raise ValueError(
                    f"wait_seconds must be between 0 and {MAX_WAIT_SECONDS:g}, got {wait_seconds}"
                )
            task = await self.wait(self.get_task(session_id, task_id), wait_seconds)
            info = self.task_info(task, include_output=True)
            if task.done():
                self._mark_read(task)
            else:
                info.setdefault(
                    "hint",
                    "still running; do other work, or call task_output again with wait_seconds",
                )
            return _json(info)

        async def task_cancel(task_id: str) -> str:
            task = await self.cancel(self.get_task(session_id, task_id))
            self._mark_read(task)
            return _json(self.task_info(task, include_output=True))

        output_schema = _task_id_schema()
        output_schema["properties"]["wait_seconds"] = {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_WAIT_SECONDS,
            "description": "seconds to wait for the report if the task still runs (default 0)",
        }
        return (
            AgentTool(
                "task_start",
                "Start a background task from a subagent profile; returns its task_id at once. "
                f"Profiles: {profiles}",
                start_schema(),
                task_start,
                guidelines=(
                    "Use `task_start` for independent work that can run while you continue; the "
                    "child does not see this conversation, so give it a complete prompt. You "
                    "will be told when it finishes."
                ),
            ),
            AgentTool(
                "task_list",
                "Show every task of this session with its status and progress.",
                {"type": "object", "properties": {}, "additionalProperties": False},
                task_list,
            ),
            AgentTool(
                "task_status",
                "Show one task's status and progress without its report; never waits.",
                _task_id_schema(),
                task_status,
            ),
            AgentTool(
                "task_output",
                "Return a task's report (or its error), waiting up to wait_seconds for it.",
                output_schema,
                task_output,
                guidelines=(
                    "Use `task_output` with wait_seconds only when you have nothing else to do; "
                    "a task that is still running comes back with status 'running'."
                ),
            ),
            AgentTool(
                "task_cancel",
                "Stop a running task; its process is killed. Returns the task once stopped.",
                _task_id_schema(),
                task_cancel,
            ),
        )

    def task_info(self, task: SubAgentTask, *, include_output: bool = False) -> SubAgentTaskInfo:
        """Describe one task for the model.

        Override to add detail. ``include_output`` is true only for the tools that return a
        report, so listings stay short.
        """
        extra: dict[str, Any] = {}
        if task.job is not None:
            if not task.done():
                task.pid = task.job.pid if task.status is SubAgentTaskStatus.RUNNING else None
                self._record_usage(task)
            # what still holds once it ended too, such as the Ray node it ran on
            extra = dict(task.job.info())
        info = SubAgentTaskInfo(
            task_id=task.task_id,
            subagent_type=task.subagent_type,
            description=task.description,
            status=task.status.value,
            elapsed_seconds=round(task.elapsed, 3),
            pid=task.pid,
            turns=task.turns,
            tool_calls=task.tool_calls,
            last_tool=task.last_tool,
            input_tokens=task.input_tokens,
            output_tokens=task.output_tokens,
            cpu_seconds=round(task.cpu_seconds, 3),
            peak_memory_bytes=task.peak_memory_bytes,
        )
        if task.progress is not None:
            info["progress"] = dict(task.progress)
        if task.error is not None and task.status is not SubAgentTaskStatus.COMPLETED:
            info["error"] = task.error
        if include_output and task.output is not None:
            info["content"] = task.output
        for key, value in extra.items():  # what the runner knows: waiting for a process...
            info.setdefault(key, value)  # type: ignore[misc]
        return info

    def completion_notice(self, task: SubAgentTask) -> str | None:
        """Return the message that tells the parent a task finished; ``None`` stays silent.

        The default points at ``task_output``; for a task the registry already forgot
        (``task.evicted``: more than ``max_retained`` finished before it was announced) it
        carries the report itself, cut to 2,000 characters, since it can no longer be read.
        """
        detail = (
            f": {task.error}"
            if task.error and task.status is not SubAgentTaskStatus.COMPLETED
            else ""
        )
        head = (
            f"Background task {task.task_id} ({task.subagent_type}: {task.description}) "
            f"{task.status.value}{detail}."
        )
        if not task.evicted:
            return f"{head} Read its report with task_output."
        forgotten = (
            f"it was evicted (only the last {self.max_retained} finished tasks are kept) and "
            "can no longer be read with task_output"
        )
        if task.status is not SubAgentTaskStatus.COMPLETED or task.output is None:
            return f"{head} Its record was evicted: {forgotten}."
        report = task.output
        if len(report) > NOTICE_REPORT_CHARS:
            cut = f", cut to {NOTICE_REPORT_CHARS} of {len(report)} characters"
            report = report[:NOTICE_REPORT_CHARS] + " [...]"
        else:
            cut = ""
        return f"{head} Its report ({forgotten}{cut}):\n{report}"

    async def task_started(self, task: SubAgentTask) -> None:
        """Observe a task that just started; the default does nothing."""

    async def task_finished(self, task: SubAgentTask) -> None:
        """Observe a task that reached a terminal status; the default does nothing.

        Its errors are logged, never raised into the task. Publish an ``InternalMessageEvent``
        here to wake an idle parent instead of waiting for its next request.
        """

    # ---------------------------------------------------------------- notices

    def _mark_read(self, task: SubAgentTask) -> None:
        session = self._sessions.get(task.parent_session_id)
        if session is not None:
            session.mark_read(task.task_id)
            self._refresh(task.parent_session_id, session)

    def _render_notice(self, task: SubAgentTask) -> str | None:
        """``completion_notice(task)`` as valid Unicode; ``None`` (logged) if it raised."""
        try:
            text = self.completion_notice(task)
        except Exception:
            log.exception("completion_notice(%s) raised; notice skipped", task.task_id)
            return None
        return None if text is None else valid_text(str(text))

    def _announce(self, context: AgentRunContext) -> None:
        session = self._sessions.get(context.session_id)
        if session is None or not (session.due or session.dropped_notices):
            return
        due, dropped = session.take_due()
        self._refresh(context.session_id, session)
        if dropped:
            context.add_message(
                AgentMessage(
                    f"{dropped} earlier background tasks finished and were forgotten (only the "
                    f"last {self.max_retained} finished tasks are kept) before they could be "
                    "announced; their reports are gone.",
                    source=self.name,
                )
            )
        for owed in due:
            text = owed if isinstance(owed, str) else self._render_notice(owed)
            if text is not None:
                context.add_message(AgentMessage(text, source=self.name))


def _json(value: Any) -> str:
    """A tool's result: JSON, as valid Unicode whatever an override of ``task_info`` or a
    runner's ``info()`` put into it."""
    return valid_text(json.dumps(value, ensure_ascii=False))
