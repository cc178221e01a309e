"""The runtime's state of one request: what the agent owns and its ``AgentRunContext`` shows.

The agent makes one ``RunState`` per request (and per ``compact``) and owns it: the session
the request holds, the tools registered so far and who registered each, the events hooks
queued, the steering messages that arrived, a version that changes with everything a model
request is assembled from, and the request's tracer. The agent's turn loop, tool dispatch and
hook calls read and write it directly, and pass it along with the request's public
``AgentRunContext``, which holds it too and exposes it only through its documented API
(``messages``, ``tools``, ``add_message``, ``publish``, ...). The state never refers to the
context: no reference cycle outlives the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zett_agent._events import AgentEvent, InternalMessageEvent
    from zett_agent._messages import Message, UserMessage
    from zett_agent._runtime._context import AgentRunConfig, AgentRunContext
    from zett_agent._session import SessionData
    from zett_agent._tools import AgentTool
    from zett_agent._tracing._base import Tracer

__all__ = ["RunState"]


class RunState:
    """One request's state, owned by the agent running it.

    ``publish(run, context, event)`` delivers an event to the agent's extensions
    (``Hooks.publish``); ``wake(config, event)`` starts the request an
    ``InternalMessageEvent`` asks for.
    """

    __slots__ = (
        "owner",
        "publish",
        "session",
        "steered",
        "steering",
        "tool_owners",
        "tools",
        "tracer",
        "unpublished",
        "version",
        "wake",
    )

    def __init__(
        self,
        session: SessionData,
        publish: Callable[[RunState, AgentRunContext, AgentEvent], Awaitable[None]],
        wake: Callable[[AgentRunConfig, InternalMessageEvent], None],
    ) -> None:
        self.session = session
        self.publish = publish
        self.wake = wake
        self.tools: dict[str, AgentTool] = {}
        self.tool_owners: dict[str, str] = {}
        #: who registers tools right now (named when two registrations conflict)
        self.owner = "the agent"
        #: events hooks queued (``add_message``), published when the hook returns
        self.unpublished: list[AgentEvent] = []
        self.steering: list[UserMessage] = []
        #: set when a steering message arrives: it interrupts the running tool batch
        self.steered = asyncio.Event()
        #: changes whenever the messages, the system prompt or the tools change
        self.version = 0
        #: the request's tracer; None when nothing is traced
        self.tracer: Tracer | None = None

    def append(self, message: Message) -> None:
        """Append ``message`` to the session's conversation."""
        self.session.messages.append(message)
        self.version += 1

    def register_tool(self, tool: AgentTool) -> None:
        """Offer ``tool`` to the model for the rest of the request, registered by ``owner``.

        Raises:
            ValueError: a tool of the same name is already registered; the message names
                who registered both.
        """
        if tool.name in self.tools:
            raise ValueError(
                f"tool {tool.name!r} registered by {self.owner} conflicts with tool "
                f"{tool.name!r} already registered by {self.tool_owners[tool.name]}; "
                "tool names must be unique within a request"
            )
        self.tools[tool.name] = tool
        self.tool_owners[tool.name] = self.owner
        self.version += 1

    def steer(self, message: UserMessage) -> None:
        """Queue a steering message and interrupt the running tool batch."""
        self.steering.append(message)
        self.steered.set()

    def take_steering(self) -> list[UserMessage]:
        """Return the steering messages queued so far, and expect new ones."""
        steered, self.steering = self.steering, []
        self.steered.clear()
        return steered
