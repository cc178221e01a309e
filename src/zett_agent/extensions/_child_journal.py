"""The child's side of a durable task: ``ChildJournal``, which sends each step to its parent.

A durable child (``AsyncSubAgentExtension(durable=True)``) runs this extension last on its
agent, whatever agent ``_create_child`` built. It sends every message appended to the child's
conversation to the parent as a journal step (``{"kind": "journal", "step": n, "entry":
ENTRY}``, see ``_journal_entries``), and the parent commits each to its task store. Two
moments are ordered so that a resume repeats no done step:

- **a model response** is sent as soon as it is appended, and the child waits for the
  parent's acknowledgement (``{"journal_ack": n}``, through the parent's messages to the
  child) before any tool call it asked for starts: once a call runs, its response is done,
  and a resume never asks the model for it again;
- **a tool result** is sent when its tool returns (before the batch of calls ends): once the
  parent committed it, a resume does not run that call again. A call whose result was not
  committed (the child died between the tool's effect and the commit) runs again: tool calls
  are at-least-once. Each call's ``tool_context().idempotency_key`` is the same on every
  resume of it (built from the child's session, the step of the response that asked for it
  and the call's place there), so a tool can make its effect exactly-once.

The other messages (the input, the parent's messages, steering, skipped calls) are sent as
they appear, before the next model call; a conversation the child replaced (compacted) is sent
whole, as one snapshot step, and the parent drops the steps before it.

Imported by every durable child (through ``_child_build``): light.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zett_agent._events import MessageAppendedEvent
from zett_agent._messages import AssistantMessage, Message, ToolMessage, ToolStatus
from zett_agent._runtime._extension import Extension
from zett_agent._tools import ToolContext, enter_tool_call
from zett_agent.extensions._journal_entries import message_entry, snapshot_entry

if TYPE_CHECKING:
    from zett_agent._events import AgentEvent
    from zett_agent._messages import ToolCall
    from zett_agent._model import ModelRequest
    from zett_agent._runtime._context import AgentRunContext
    from zett_agent._tools import ToolResult

__all__ = ["ACK", "EVENT", "ChildJournal", "idempotency_key"]

#: the ``kind`` of a child's journal event
EVENT = "journal"
#: the key of the parent's acknowledgement, ``{"journal_ack": step}``
ACK = "journal_ack"


def idempotency_key(session_id: str, step: int, index: int, call_id: str) -> str:
    """The key of call ``index`` (id ``call_id``) of the response journaled as ``step``."""
    material = f"{session_id}\0{step}\0{index}\0{call_id}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()[:32]


class ChildJournal(Extension):
    """Sends the child's conversation to its parent, step by step, and waits where it must.

    Args:
        messages: The child session's own list of messages (the one its requests append to),
            already holding what a resume restored.
        session_id: The child's session.
        emit: Sends an event to the parent.
        next_step: The number of the next step (the parent's journal holds those before).
        batch_step: The step of the response whose calls may still run (a resume in the
            middle of a batch), else ``None``.
    """

    name = "zett_agent.child_journal"

    def __init__(
        self,
        messages: list[Message],
        session_id: str,
        emit: Callable[[Any], None],
        *,
        next_step: int,
        batch_step: int | None = None,
    ) -> None:
        super().__init__()
        self._live = messages
        self._session_id = session_id
        self._emit = emit
        self._next = next_step
        #: the journal holds ``_live[:_known]``; the first and last of them, to notice a
        #: conversation that was replaced
        self._known = len(messages)
        self._first = messages[0] if messages else None
        self._last = messages[-1] if messages else None
        #: tool results sent when their tool returned, not yet seen appended
        self._sent_calls: set[str] = set()
        #: the input of the request that is starting (sent marked as such)
        self._input: object = None
        #: the step acknowledged last, and who waits for one
        self._acked = next_step - 1
        self._waiting: dict[int, asyncio.Future[None]] = {}
        #: the response whose calls run: its step, and each call's place in it
        self._batch: tuple[int, dict[str, int]] = (0, {})
        last = self._last_response()
        if batch_step is not None and last is not None:
            self._batch = (batch_step, {c.id: n for n, c in enumerate(last.tool_calls)})

    # -- the parent's acknowledgements ------------------------------------------------------

    def acked(self, step: Any) -> None:
        """The parent committed every step up to ``step`` (its message; anything else ignored)."""
        if type(step) is not int or step <= self._acked:
            return
        self._acked = step
        for waiting in [n for n in self._waiting if n <= step]:
            future = self._waiting.pop(waiting)
            if not future.done():
                future.set_result(None)

    async def _committed(self, step: int) -> None:
        if step <= self._acked:
            return
        future = self._waiting.get(step)
        if future is None:
            future = self._waiting[step] = asyncio.get_running_loop().create_future()
        await future

    # -- the hooks ---------------------------------------------------------------------------

    async def on_message(self, context: AgentRunContext) -> None:
        # the input as the other extensions left it (this one runs last)
        self._input = context.input_message

    async def on_event(self, context: AgentRunContext, event: AgentEvent) -> None:
        if (
            type(event) is MessageAppendedEvent
            and isinstance(event.message, AssistantMessage)
            and event.session_id == self._session_id
        ):
            step = self._sync(wait=True)
            message = event.message
            self._batch = (step, {c.id: n for n, c in enumerate(message.tool_calls)})
            await self._committed(step)  # before after_model, before any of its calls

    async def before_model(self, context: AgentRunContext, request: ModelRequest) -> None:
        self._sync()  # the last extension here: what the others added is in

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        step, places = self._batch
        index = places.get(call.id, -1)
        key = idempotency_key(self._session_id, step, index, call.id)
        enter_tool_call(ToolContext(call, context.session_id, key))

    async def after_tool(
        self,
        context: AgentRunContext,
        call: ToolCall,
        result: ToolResult,
        error: BaseException | None,
    ) -> None:
        # the last after_tool: this is the result the runtime appends once the batch settled
        status = ToolStatus.FAILED if result.is_error else ToolStatus.OK
        self._send(message_entry(ToolMessage(call.id, call.name, result.text, status)))
        self._sent_calls.add(call.id)

    # -- sending -----------------------------------------------------------------------------

    def _sync(self, *, wait: bool = False) -> int:
        """Send what was appended since the last sync; return the last step sent.

        The whole conversation, as one snapshot, if it was replaced. ``wait``: the parent
        acknowledges the last step.
        """
        live, known = self._live, self._known
        replaced = len(live) < known or (
            known > 0 and (live[0] is not self._first or live[known - 1] is not self._last)
        )
        step = self._next - 1
        if replaced:
            self._sent_calls.clear()
            step = self._send(snapshot_entry(live), wait=wait)
        else:
            new = live[known:]
            for position, message in enumerate(new):
                if isinstance(message, ToolMessage) and message.call_id in self._sent_calls:
                    self._sent_calls.discard(message.call_id)
                    continue
                entry = message_entry(message, input=message is self._input)
                step = self._send(entry, wait=wait and position == len(new) - 1)
        self._known = len(live)
        self._first = live[0] if live else None
        self._last = live[-1] if live else None
        return step

    def _send(self, entry: dict[str, Any], *, wait: bool = False) -> int:
        step = self._next
        self._next += 1
        event: dict[str, Any] = {"kind": EVENT, "step": step, "entry": entry}
        if wait:
            event["ack"] = True
        self._emit(event)
        return step

    def _last_response(self) -> AssistantMessage | None:
        for message in reversed(self._live):
            if isinstance(message, AssistantMessage):
                return message
        return None
