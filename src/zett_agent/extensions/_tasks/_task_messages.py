"""Messages from the parent to one running task: what was sent, what the child confirmed.

``task_message`` (and ``AsyncSubAgentExtension.send``) queue a ``MessageRecord`` here; the
extension's pump hands the queued ones to the job (``SupportsSend.send``) once the child runs,
in order, and the child's ``message_delivered`` events confirm them. A message counts as
delivered only on that confirmation: one the child never read before it ended stays
``undelivered``, and the task's info and completion notice say which.

Bounds per task (the parent's memory and the child's context): ``MAX_MESSAGE_CHARS`` per
message, ``MAX_MESSAGES`` per task over its whole life. A delivered message's text is dropped
(the child has it); only its id stays.
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_MESSAGES", "MAX_MESSAGE_CHARS", "MessageRecord", "MessageState", "TaskMessages"]

#: longest message, in characters
MAX_MESSAGE_CHARS = 20_000
#: messages one task may be sent over its whole life
MAX_MESSAGES = 100


class MessageState(enum.Enum):
    """Where a message is: ``QUEUED`` -> ``SENT`` -> ``DELIVERED``.

    ``QUEUED``: accepted, not handed to the child yet. Any state but ``DELIVERED`` becomes
    ``UNDELIVERED`` when the task ends.
    """

    QUEUED = "queued"
    SENT = "sent"
    DELIVERED = "delivered"
    UNDELIVERED = "undelivered"


@dataclass(eq=False)
class MessageRecord:
    """One message to a task.

    ``received`` is set once the child said it has it (not yet read by its model);
    ``settled`` once it is delivered or can never be.
    """

    message_id: str
    text: str | None
    interrupt: bool
    state: MessageState = MessageState.QUEUED
    received: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    settled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def wire(self) -> dict[str, Any]:
        """What the child receives."""
        return {"id": self.message_id, "text": self.text or "", "interrupt": self.interrupt}


class TaskMessages:
    """The messages of one task, in the order they were sent."""

    def __init__(self) -> None:
        self.records: OrderedDict[str, MessageRecord] = OrderedDict()
        #: queued records not handed to the child yet, oldest first
        self.outbox: deque[MessageRecord] = deque()
        self.delivered = 0
        #: the task that hands ``outbox`` to the job (None when idle)
        self.pump: asyncio.Task[None] | None = None
        self.ended = False

    @property
    def sent(self) -> int:
        return len(self.records)

    def add(self, text: str, interrupt: bool) -> MessageRecord:
        """Accept one message; ``ValueError`` when it breaks a bound."""
        if len(text) > MAX_MESSAGE_CHARS:
            raise ValueError(
                f"the message has {len(text)} characters, more than the {MAX_MESSAGE_CHARS} a "
                "message may have; shorten it, or put the details in a file the task can read"
            )
        if len(self.records) >= MAX_MESSAGES:
            raise ValueError(
                f"this task was already sent {len(self.records)} messages, the most one task "
                f"may get ({MAX_MESSAGES}); wait for its report, or cancel it and start a new "
                "one with the full instructions"
            )
        record = MessageRecord(f"msg-{len(self.records) + 1}", text, interrupt)
        self.records[record.message_id] = record
        self.outbox.append(record)
        return record

    def arrived(self, message_id: Any) -> None:
        """The child said it has ``message_id`` (only a message it was sent counts)."""
        record = self.records.get(message_id) if isinstance(message_id, str) else None
        if record is not None and record.state is MessageState.SENT:
            record.received.set()

    def confirm(self, message_id: Any) -> bool:
        """The child confirmed ``message_id``; ``True`` if that changed anything.

        An id it was not sent yet, or one confirmed already, changes nothing.
        """
        if not isinstance(message_id, str):
            return False
        record = self.records.get(message_id)
        if record is None or record.state is not MessageState.SENT:
            return False
        record.state = MessageState.DELIVERED
        record.text = None
        record.received.set()
        record.settled.set()
        self.delivered += 1
        return True

    def end(self) -> list[str]:
        """The task ended: every message not delivered never will be. Returns their ids."""
        self.ended = True
        self.outbox.clear()
        if self.pump is not None:
            self.pump.cancel()
        lost = []
        for record in self.records.values():
            if record.state is not MessageState.DELIVERED:
                record.state = MessageState.UNDELIVERED
                record.text = None
                record.settled.set()
                lost.append(record.message_id)
        return lost

    def undelivered(self) -> list[str]:
        return [r.message_id for r in self.records.values() if r.state is MessageState.UNDELIVERED]

    def stored(self) -> dict[str, Any]:
        """What a ``TaskStore`` keeps: the counts and the ids not delivered (yet)."""
        pending = [
            r.message_id for r in self.records.values() if r.state is not MessageState.DELIVERED
        ]
        return {"sent": self.sent, "delivered": self.delivered, "pending": pending}

    @classmethod
    def restored(cls, stored: dict[str, Any]) -> TaskMessages:
        """The messages of a task restored from a store.

        It ended, so those not delivered never will be.
        """
        messages = cls()
        pending = stored.get("pending")
        pending = set(pending) if isinstance(pending, list) else set()
        sent = stored.get("sent")
        for number in range(1, min(sent if isinstance(sent, int) else 0, MAX_MESSAGES) + 1):
            record = MessageRecord(f"msg-{number}", None, False)
            if record.message_id in pending:
                record.state = MessageState.UNDELIVERED
            else:
                record.state = MessageState.DELIVERED
                messages.delivered += 1
            record.settled.set()
            messages.records[record.message_id] = record
        messages.ended = True
        return messages

    def summary(self) -> dict[str, Any]:
        """The task info's ``messages`` entry."""
        entry: dict[str, Any] = {"sent": self.sent, "delivered": self.delivered}
        if self.ended:
            lost = self.undelivered()
            if lost:
                entry["undelivered"] = lost
        return entry
