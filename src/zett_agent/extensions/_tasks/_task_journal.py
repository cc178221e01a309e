"""A durable task's journal in the parent: each step its child sends checked, kept, acknowledged.

A durable child sends each step of its conversation as an event (``_child_journal``):
``{"kind": "journal", "step": n, "entry": ENTRY}``, with ``"ack": true`` when it waits for the
commit. ``TaskJournal.fold`` takes it on the event loop, as hostile input: the step must be
the next one, the entry must be one (``_journal_entries.decode_entry``), it must fit a step
(``MAX_ENTRY_BYTES``) and the journal must stay within its bound (``MAX_STEPS`` steps and
``MAX_JOURNAL_BYTES`` bytes at once; a snapshot, the child's compacted conversation, starts it
anew). It queues the step for the store's writer thread and, once the step is committed,
acknowledges it to the child (``{"id": "journal-ack-n", "journal_ack": n}`` through
``ChildJob.send``). A step the
parent refuses, or the store fails to write, stops the task (its child's tree killed, the
reason its failure; it is never resumed): a journal that does not hold what the child did
would make a resume repeat or skip work.

What a child can do with its steps: make its own resume start from any conversation it likes
(it can hurt only itself), within the bounds above, in the parent's store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

from zett_agent.extensions._journal_entries import (
    MAX_JOURNAL_BYTES,
    MAX_STEPS,
    BadEntry,
    decode_entry,
    entry_text,
)
from zett_agent.extensions._tasks._task_guard import TaskPart
from zett_agent.runners._base import SupportsSend

if TYPE_CHECKING:
    from zett_agent.extensions._tasks._task import SubAgentTask
    from zett_agent.extensions._tasks._task_guard import Chores, TaskGuard
    from zett_agent.extensions._tasks._task_owner import TaskOwner
    from zett_agent.extensions._tasks._task_registry import TaskRegistry
    from zett_agent.runners._base import ChildJob

__all__ = ["TaskJournal"]

# the records keep the name they always had: the extension's module
log = logging.getLogger("zett_agent.extensions._async_subagent")

_KEYS = frozenset({"kind", "step", "entry", "ack"})


class TaskJournal(TaskPart):
    """The journals of the owner's durable tasks, as their children send them."""

    def __init__(
        self, owner: TaskOwner, registry: TaskRegistry, chores: Chores, guard: TaskGuard
    ) -> None:
        super().__init__(owner, registry, chores)
        self._guard = guard

    def fold(self, task: SubAgentTask, event: Any) -> bool:
        """Take one event of ``task``'s child if it is a journal step; whether it was one."""
        if type(event) is not dict or event.get("kind") != "journal":
            return False
        durable, job, store = task.durable, task.job, self._registry.store
        if durable is None or job is None or store is None:
            return True  # not a durable task: nothing to keep
        if task.stop_reason is not None or task.done():
            return True  # being stopped: nothing more is kept
        try:
            step = event.get("step")
            if event.keys() - _KEYS:
                raise BadEntry(f"unknown keys {sorted(str(k)[:40] for k in event.keys() - _KEYS)}")
            if type(step) is not int or step != durable.next_step:
                raise BadEntry(f"step {step!r:.40} came where step {durable.next_step} was due")
            if event.get("ack", False) not in (True, False):
                raise BadEntry("ack must be true or false")
            entry = decode_entry(event.get("entry"))
            text = entry_text(event["entry"])
        except BadEntry as exc:
            self._guard.stop(
                task, f"the child sent a journal step the parent refused and was stopped: {exc}"
            )
            return True
        size = len(text.encode("utf-8"))
        steps, total = (1, size) if entry.snapshot else (durable.steps + 1, durable.bytes + size)
        if steps > MAX_STEPS or total > MAX_JOURNAL_BYTES:
            self._guard.stop(
                task,
                f"its journal went past its bound ({MAX_STEPS} steps, {MAX_JOURNAL_BYTES} bytes; "
                f"it would hold {steps} steps, {total} bytes) and it was stopped; a durable "
                "child that runs long must compact its history",
            )
            return True
        durable.steps, durable.bytes, durable.next_step = steps, total, step + 1
        # a step the child waits for is acknowledged once committed; any other wakes no one
        ack = functools.partial(self._committed, task, job, step) if event.get("ack") else None
        store.journal(
            task.parent_session_id,
            task.task_id,
            step,
            text,
            snapshot=entry.snapshot,
            failed=functools.partial(self._failed, task),
            committed=ack,
        )
        return True

    def _failed(self, task: SubAgentTask, error: BaseException) -> None:
        self._guard.stop(
            task, f"the task store could not write its journal, so it was stopped: {error}"
        )

    def _committed(self, task: SubAgentTask, job: ChildJob, ack: int) -> None:
        if task.job is not job or task.done() or task.stop_reason is not None:
            return
        if isinstance(job, SupportsSend):
            self._chores.add(
                asyncio.get_running_loop().create_task(
                    self._send(task, job, job, ack), name=f"zett-agent-ack-{task.task_id}"
                )
            )

    async def _send(
        self, task: SubAgentTask, job: ChildJob, channel: SupportsSend, step: int
    ) -> None:
        # an id, as every message to a child has (a runner may deliver by it)
        try:
            await channel.send({"id": f"journal-ack-{step}", "journal_ack": step})
        except RuntimeError as exc:
            if task.job is job and not job.done():  # it waits for this: it would never go on
                self._guard.stop(
                    task, f"its child could not be told that step {step} was committed: {exc}"
                )
