"""Background task records and the per-session registry that keeps them."""

from __future__ import annotations

import asyncio
import enum
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from zett_agent._text import valid_text

if TYPE_CHECKING:
    from zett_agent._runtime._agent import Agent
    from zett_agent.extensions._tasks._durable import DurableState
    from zett_agent.extensions._tasks._task_messages import TaskMessages
    from zett_agent.runners._base import ChildJob


class SubAgentTaskStatus(enum.Enum):
    """Lifecycle of a background task: PENDING -> RUNNING -> one terminal status."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {SubAgentTaskStatus.COMPLETED, SubAgentTaskStatus.FAILED, SubAgentTaskStatus.CANCELLED}
)
_ALLOWED = {
    SubAgentTaskStatus.PENDING: {SubAgentTaskStatus.RUNNING, *_TERMINAL},
    SubAgentTaskStatus.RUNNING: set(_TERMINAL),
}


class SubAgentTaskInfo(TypedDict, total=False):
    """What the task tools return to the model (as JSON). Override ``task_info`` to add keys."""

    task_id: str
    subagent_type: str
    description: str
    status: str
    elapsed_seconds: float
    pid: int | None
    turns: int
    tool_calls: int
    last_tool: str | None
    input_tokens: int
    output_tokens: int
    cpu_seconds: float
    peak_memory_bytes: int
    progress: dict[str, int]
    error: str
    content: str
    hint: str
    waiting: str
    idle_seconds: float
    needs_attention: bool
    total_tokens: int
    token_budget: int
    messages: dict[str, Any]
    lost: bool
    resumes: int
    deaths: list[dict[str, Any]]


@dataclass(eq=False)
class SubAgentTask:
    """One background child agent, as the parent's registry sees it.

    ``session_id`` is the child's own session; ``parent_session_id`` is the session that started
    it (and the only one that can see it). Progress fields update while the child runs.

    Reading a report from code: ``await extension.wait(task)``, then ``task.output`` (the
    report of a ``completed`` task) or ``task.error`` (the one-line reason of a ``failed`` or
    ``cancelled`` one); ``extension.task_info(task, include_output=True)`` gives both as the
    model sees them. The object keeps its report after the registry forgot it (``evicted``).

    ``progress`` is what a tool running in the child last reported about its own work, as
    ``{"done": n}`` or ``{"done": n, "total": m}``: a tool reports it by calling
    ``zett_agent.process.emit({"kind": "progress", "done": n, "total": m})`` (non-negative ints;
    anything else is ignored). It stays ``None`` for children whose tools report nothing.

    ``idle_seconds`` is the time since the child's last sign of work (any event it sent: a
    model call starting, streaming or ending, a tool call, a progress report), frozen once the
    task ended. ``token_budget`` (from the definition) caps ``total_tokens``, the input plus
    output tokens of its model calls. ``lost`` marks a task restored from a ``TaskStore``
    that was still running when its host stopped (it reads ``failed``), unless it was durable:
    then it resumed (``durable`` holds its tries and their deaths).
    """

    task_id: str
    parent_session_id: str
    session_id: str
    subagent_type: str
    description: str
    prompt: str
    status: SubAgentTaskStatus = SubAgentTaskStatus.PENDING
    created_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    finished_monotonic: float | None = None
    output: str | None = None
    error: str | None = None
    pid: int | None = None
    turns: int = 0
    tool_calls: int = 0
    last_tool: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cpu_seconds: float = 0.0
    peak_memory_bytes: int = 0
    #: True once the registry forgot the task (only ``max_retained`` finished tasks are kept):
    #: the tools can no longer read it, so its completion notice carries a short report
    evicted: bool = False
    progress: dict[str, int] | None = None
    token_budget: int | None = None
    #: restored from a store: it was running when its host stopped
    lost: bool = False
    #: ``time.monotonic()`` of the child's last sign of work
    last_activity: float = field(default_factory=time.monotonic)
    #: why the extension stopped it (a budget), which its failure then says
    stop_reason: str | None = field(default=None, repr=False)
    #: the stall of the moment was announced (cleared when the child works again)
    stalled: bool = field(default=False, repr=False)
    #: tokens already added to the session's total
    counted_tokens: int = field(default=0, repr=False)
    #: the usage counts come from the runner (brokered calls), not the child's reports
    trusted_tokens: bool = field(default=False, repr=False)
    #: the input and output tokens the child's own reports add up to (``turn_finished``)
    reported_tokens: tuple[int, int] = field(default=(0, 0), repr=False)
    messages: TaskMessages | None = field(default=None, repr=False)
    #: a durable task's resumes, deaths and journal (``None``: not durable)
    durable: DurableState | None = field(default=None, repr=False)
    #: ``cancel`` was asked for: a resume in progress cancels the child it starts
    cancelling: bool = field(default=False, repr=False)
    #: its host closed while it ran: it ended here, its store still says running (durable)
    suspended: bool = field(default=False, repr=False)
    job: ChildJob | None = field(default=None, repr=False)
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    settled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    #: set once the child runs (or the task ended): messages go to it from then on
    running: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    stall_timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    #: called with the task once it reached a terminal status (``wait_any``, ``wait_all``)
    settle_callbacks: list[Callable[[SubAgentTask], object]] = field(
        default_factory=list, repr=False
    )

    @property
    def elapsed(self) -> float:
        """Seconds since the task started, frozen once it finished."""
        end = self.finished_monotonic if self.finished_monotonic is not None else time.monotonic()
        return end - self.started_monotonic

    @property
    def idle_seconds(self) -> float:
        """Seconds since the child's last sign of work, frozen once the task ended."""
        end = self.finished_monotonic if self.finished_monotonic is not None else time.monotonic()
        return max(0.0, end - self.last_activity)

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens of the child's model calls so far."""
        return self.input_tokens + self.output_tokens

    def done(self) -> bool:
        return self.status.terminal

    def reopen(self) -> None:
        """Make a finished task pending again, for a follow-up (``task_resume``).

        Its report, error and stop reason go; its clock, its events and its messages start
        anew; its counts (turns, tokens) go on.
        """
        if not self.status.terminal:
            raise RuntimeError(f"task {self.task_id}: only a finished task reopens")
        self.status = SubAgentTaskStatus.PENDING
        self.output = self.error = self.stop_reason = None
        self.cancelling = self.suspended = self.stalled = False
        self.started_monotonic = self.last_activity = time.monotonic()
        self.finished_monotonic = None
        self.settled = asyncio.Event()
        self.running = asyncio.Event()
        self.messages = None
        self.job = self.watcher = None

    def transition(self, new: SubAgentTaskStatus) -> None:
        """Move to ``new``; raises ``RuntimeError`` for an illegal transition."""
        if new is self.status:
            return
        if new not in _ALLOWED.get(self.status, set()):
            raise RuntimeError(f"task {self.task_id}: illegal transition {self.status} -> {new}")
        self.status = new
        if new.terminal:
            self.finished_monotonic = time.monotonic()
            self.pid = None
            self.settled.set()
            callbacks, self.settle_callbacks = self.settle_callbacks, []
            for callback in callbacks:
                callback(self)
        self.running.set()

    def fold_progress(self, event: Any, *, count_tokens: bool = True) -> bool:
        """Apply one progress event the child emitted; return whether it changed progress.

        Unknown kinds are ignored. The usage it reports adds up in ``reported_tokens``;
        ``count_tokens=False`` keeps it out of ``input_tokens`` and ``output_tokens`` (the
        runner counts those).
        """
        if not isinstance(event, dict):
            return False
        kind = event.get("kind")
        before = (self.turns, self.tool_calls, self.reported_tokens, self.progress)
        if kind == "turn_started":
            self.turns = max(self.turns, _int(event.get("turn")))
        elif kind == "turn_finished":
            names = event.get("tool_calls")
            if isinstance(names, list) and names:
                self.tool_calls += len(names)
                self.last_tool = valid_text(str(names[-1])[:100])
            reported_in, reported_out = self.reported_tokens
            self.reported_tokens = (
                reported_in + _int(event.get("input_tokens")),
                reported_out + _int(event.get("output_tokens")),
            )
            if count_tokens:
                self.input_tokens, self.output_tokens = self.reported_tokens
        elif kind == "progress":
            done, total = event.get("done"), event.get("total")
            if isinstance(done, int) and _count(done):
                if total is None:
                    self.progress = {"done": done}
                elif isinstance(total, int) and _count(total):
                    self.progress = {"done": done, "total": total}
        else:
            return False
        after = (self.turns, self.tool_calls, self.reported_tokens, self.progress)
        return after != before

    def __repr__(self) -> str:
        return (
            f"<SubAgentTask {self.task_id} {self.subagent_type} {self.status.value} "
            f"turns={self.turns} pid={self.pid}>"
        )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT


#: most a child's event may count (tokens, a turn number): beyond any real use, and a sum of
#: such counts stays far from what a sqlite INTEGER holds for a long time
_MAX_COUNT = 10**12


def _int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return min(value, _MAX_COUNT)
    return 0


#: longest report a completion notice carries for a task evicted before it was announced
NOTICE_REPORT_CHARS = 2000


class SessionTasks:
    """The tasks one parent session started, and the completion notices it still owes.

    Bounds, at all times: running tasks (``max_concurrent``, checked by the extension),
    finished tasks kept (``max_retained``; the oldest finished are forgotten first, in the order
    they finished), notices owed for forgotten tasks (each rendered to a short text when its
    task was forgotten; beyond ``max(max_retained, 16)`` of them the oldest become one count),
    and the ids remembered as evicted. The extension forgets a whole session once it is
    ``idle`` and more than ``max_sessions`` idle ones are kept, or when the last open agent
    that ran it closed (``users``).
    """

    def __init__(self, max_retained: int) -> None:
        self.tasks: OrderedDict[str, SubAgentTask] = OrderedDict()
        #: tasks added and not finished yet
        self.active = 0
        #: the open agents that ran requests of this session (closing the last one releases it)
        self.users: weakref.WeakSet[Agent] = weakref.WeakSet()
        #: set once the session is being released: no task starts in it any more
        self.released = False
        #: set while no start is in flight (``starting == 0``)
        self.no_starts = asyncio.Event()
        self.no_starts.set()
        #: why the session's earlier records were forgotten, if they were (for ``get_task``)
        self.forgotten_before: str | None = None
        #: ids of the finished tasks kept, oldest finished first
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.evicted: OrderedDict[str, None] = OrderedDict()
        #: notices owed, in the order the tasks finished: the task while it is kept, else the
        #: notice text rendered when it was forgotten
        self.due: OrderedDict[str, SubAgentTask | str] = OrderedDict()
        #: starts that reserved a ``max_concurrent`` slot and are not registered yet
        self.starting = 0
        #: notices of forgotten tasks dropped to keep ``due`` bounded (announced as a count)
        self.dropped_notices = 0
        #: running tasks whose stall the parent was not told about yet
        self.attention: OrderedDict[str, SubAgentTask] = OrderedDict()
        #: input plus output tokens of every task the session ran (its token budget)
        self.spent_tokens = 0
        self._rendered = 0
        self._max_retained = max_retained
        self._max_rendered = max(max_retained, 16)

    def running(self) -> list[SubAgentTask]:
        return [t for t in self.tasks.values() if not t.done()]

    @property
    def idle(self) -> bool:
        """Nothing running, nothing starting, no notice owed.

        Forgetting it loses nothing anyone waits for.
        """
        return not (self.active or self.starting or self.due or self.dropped_notices)

    def add(self, task: SubAgentTask) -> None:
        self.tasks[task.task_id] = task
        self.active += 1

    def finish(
        self, task: SubAgentTask, *, notify: bool, render: Callable[[SubAgentTask], str | None]
    ) -> list[str]:
        """Record a task that reached its terminal status; return the ids it made forget.

        Then forget the oldest finished tasks beyond ``max_retained`` (their ids are
        returned). ``render`` writes the notice of a forgotten task whose notice is still
        owed (it is called with ``task.evicted`` already true).
        """
        self.active -= 1
        self.finished[task.task_id] = None
        self.attention.pop(task.task_id, None)
        if notify:
            self.due[task.task_id] = task
        forgotten_ids = []
        while len(self.finished) > self._max_retained:
            task_id, _ = self.finished.popitem(last=False)
            forgotten_ids.append(task_id)
            forgotten = self.tasks.pop(task_id)
            forgotten.evicted = True
            self.evicted[task_id] = None
            if task_id in self.due:
                text = render(forgotten)
                if text is None:
                    del self.due[task_id]
                else:
                    self.due[task_id] = text
                    self._rendered += 1
        while self._rendered > self._max_rendered:
            for task_id, owed in self.due.items():
                if isinstance(owed, str):
                    del self.due[task_id]
                    self._rendered -= 1
                    self.dropped_notices += 1
                    break
        while len(self.evicted) > 10 * max(self._max_retained, 100):
            self.evicted.popitem(last=False)
        return forgotten_ids

    def reopen(self, task: SubAgentTask) -> None:
        """A finished task of the session runs again (``task_resume``): no notice owed for it."""
        if self.finished.pop(task.task_id, 0) is None:  # it was among the finished ones
            self.active += 1
        self.mark_read(task.task_id)

    def mark_read(self, task_id: str) -> None:
        """The model read the task's outcome through a tool: it owes no notice any more."""
        owed = self.due.pop(task_id, None)
        if isinstance(owed, str):
            self._rendered -= 1

    def take_due(self) -> tuple[list[SubAgentTask | str], int]:
        """The notices owed (oldest first) and the count of dropped ones; both reset."""
        due, dropped = list(self.due.values()), self.dropped_notices
        self.due.clear()
        self._rendered = self.dropped_notices = 0
        return due, dropped

    def take_attention(self) -> list[SubAgentTask]:
        """The stalled tasks the parent was not told about yet; reset."""
        stalled = list(self.attention.values())
        self.attention.clear()
        return stalled


def describe(task: SubAgentTask, include_output: bool, *, attention: bool) -> SubAgentTaskInfo:
    """The default ``task_info`` of ``task`` (see ``AsyncSubAgentExtension.task_info``).

    ``attention``: whether it needs attention (idle beyond ``stall_seconds``).
    """
    # what the runner knows, which still holds once it ended too (the Ray node it ran on)
    extra: dict[str, Any] = dict(task.job.info()) if task.job is not None else {}
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
    info["total_tokens"] = task.total_tokens
    if task.token_budget is not None:
        info["token_budget"] = task.token_budget
    info["idle_seconds"] = round(task.idle_seconds, 3)
    if attention:
        info["needs_attention"] = True
    if task.messages is not None:
        info["messages"] = task.messages.summary()
    if task.lost:
        info["lost"] = True
    if task.durable is not None:
        info["resumes"] = task.durable.resumes
        if task.durable.deaths:
            info["deaths"] = [dict(death) for death in task.durable.deaths]
    if task.error is not None and task.status is not SubAgentTaskStatus.COMPLETED:
        info["error"] = task.error
    if include_output and task.output is not None:
        info["content"] = task.output
    for key, value in extra.items():  # what the runner knows: waiting for a process...
        info.setdefault(key, value)  # type: ignore[misc]
    return info
