"""The child's side of ``task_message``: ``ChildInbox``, the extension every child agent runs.

The parent sends a running child messages (``ChildJob.send``) shaped ``{"id": str, "text":
str, "interrupt": bool}``; ``run_child`` hands each one the runner's ``receive`` returns to
the child's ``ChildRun`` (``_child_build``), which gives it to ``ChildInbox.take``. A message
is then delivered as a ``UserMessage`` to the child's own agent:

- without ``interrupt``: it waits for the child's next model call and is appended to the
  session by this extension's ``before_model`` (so it is part of that call's request, and of
  the conversation from then on);
- with ``interrupt``: it steers the running request as ``Agent.steer`` does (its current tool
  batch is interrupted, the calls not yet run are skipped); the runtime appends it once that
  batch settled. A child not in a request yet takes it like a message without ``interrupt``.

Delivery is confirmed, not assumed: once the message is in the request of a model call, the
child emits ``{"kind": "message_delivered", "id": ...}``, just before the call starts. A
message the child never reached another model call for is never confirmed (the parent says
so once the task ended). Its arrival is reported too (``{"kind": "message_received", "id":
...}``, as soon as the child has it): the parent keeps it apart from delivery, for the
benchmark of the channel and for tests that wait until a message is in the child.

The extension also reports each tool call as it starts (``{"kind": "tool_called", "name":
...}``): for the parent, a sign of work (``idle_seconds``) between model calls.

Imported by every child (through ``_child_build``): light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zett_agent._messages import ToolCall, UserMessage
from zett_agent._runtime._agent import add_extension, steerable
from zett_agent._runtime._extension import Extension
from zett_agent._text import valid_text

if TYPE_CHECKING:
    from zett_agent._model import ModelRequest
    from zett_agent._runtime._agent import Agent
    from zett_agent._runtime._context import AgentRunConfig, AgentRunContext

__all__ = ["ChildInbox", "attach"]

#: what the child accepts of one message (the parent bounds it far below; a mistake here must
#: not grow the child's memory without end)
_MAX_TEXT = 1_000_000
_MAX_ID = 100


class ChildInbox(Extension):
    """Appends the parent's messages before the child's next model call, and confirms them.

    Registered last on the child's agent by ``build_child`` (whatever agent ``_create_child``
    built), so its ``before_model`` runs after every other extension's.
    """

    name = "zett_agent.child_inbox"

    def __init__(self, agent: Agent, config: AgentRunConfig, emit: Callable[[Any], None]) -> None:
        super().__init__()
        self._agent = agent
        self._config = config
        self._emit = emit
        #: messages for the next model call, in the order they came
        self._waiting: list[tuple[str, UserMessage]] = []
        #: steered messages not yet seen in a request
        self._steered: dict[str, UserMessage] = {}

    def take(self, message: Any) -> None:
        """One message from the parent: queue it, or steer the running request with it.

        Anything not shaped like a message is ignored (only the parent sends on this topic).
        """
        if not isinstance(message, dict):
            return
        message_id, text = message.get("id"), message.get("text")
        if not isinstance(message_id, str) or not isinstance(text, str):
            return
        message_id, text = message_id[:_MAX_ID], valid_text(text[:_MAX_TEXT])
        self._emit({"kind": "message_received", "id": message_id})
        user = UserMessage(text)
        if message.get("interrupt") is True and self._in_request():
            self._agent.steer(user, config=self._config)
            self._steered[message_id] = user
            return
        self._waiting.append((message_id, user))

    def _in_request(self) -> bool:
        """Whether the child's agent runs a request ``Agent.steer`` steers.

        For any other state, ``steer`` would start a request of its own, which the child
        never awaits.
        """
        return steerable(self._agent, self._config.session_id)

    async def before_model(self, context: AgentRunContext, request: ModelRequest) -> None:
        for message_id, user in self._waiting:
            context.add_message(user)  # the runtime reassembles the request: this call has it
            self._emit({"kind": "message_delivered", "id": message_id})
        self._waiting.clear()
        if self._steered:
            # the runtime appended steered messages when their batch settled; identity, since
            # two messages may have the same text
            present = {id(m) for m in request.messages}
            for message_id, user in list(self._steered.items()):
                if id(user) in present:
                    del self._steered[message_id]
                    self._emit({"kind": "message_delivered", "id": message_id})

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        self._emit({"kind": "tool_called", "name": valid_text(call.name[:100])})


def attach(agent: Agent, extension: Extension) -> None:
    """Register ``extension`` (the inbox, a durable child's journal) last on ``agent``.

    The agent is whatever ``_create_child`` built (the user's override may build it from
    anything), so the extension cannot be passed to its constructor: it is added afterwards.
    It wraps neither model requests nor tool calls, so only the hook list changes.
    """
    add_extension(agent, extension)
