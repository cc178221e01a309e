"""An agent's extensions within a request: calling one hook on each, and publishing events.

``Hooks`` holds the agent's extensions in registration order. It calls a hook on each of them
(naming the extension as the owner of the tools it registers meanwhile, and publishing the
events the hook queued once it returns), runs the ``on_error`` hooks, appends a message with its
``MessageAppendedEvent``, and publishes an event to every ``on_event`` hook. An
``InternalMessageEvent`` then wakes its session through the request's ``RunState.wake``.

Every method takes the request's state and its context side by side: the state never refers
to the context, nor this object to its agent, so no reference cycle keeps an agent or a
request alive after use (reference counting frees them, as ``WeakSet`` users expect).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from zett_agent._events import AgentEvent, InternalMessageEvent, MessageAppendedEvent

if TYPE_CHECKING:
    from zett_agent._messages import Message
    from zett_agent._runtime._context import AgentRunContext, RunState
    from zett_agent._runtime._extension import Extension

__all__ = ["Hooks"]

logger = logging.getLogger("zett_agent.agent")


class Hooks:
    """The extensions of one agent, and how a request calls them.

    ``extensions`` may be replaced by a longer tuple (``zett_agent._runtime._agent.add_extension``);
    every hook call from then on includes the new extension.
    """

    __slots__ = ("extensions",)

    def __init__(self, extensions: tuple[Extension, ...]) -> None:
        self.extensions = extensions

    async def call(self, run: RunState, context: AgentRunContext, hook: str, *args: Any) -> None:
        """Call ``hook`` of every extension, in order, each followed by a ``flush``.

        Raises:
            Exception: whatever a hook raised (later extensions are not called).
        """
        for ext in self.extensions:
            run.owner = f"extension {ext.name!r}"
            try:
                await getattr(ext, hook)(context, *args)
            finally:
                run.owner = "the agent"
            await self.flush(run, context)

    async def on_error(self, run: RunState, context: AgentRunContext, error: BaseException) -> None:
        """Call every ``on_error`` hook; what one raises is logged, never raised."""
        for ext in self.extensions:
            try:
                await ext.on_error(context, error)
            except Exception:
                logger.exception("on_error of extension %r raised", ext.name)

    async def flush(self, run: RunState, context: AgentRunContext) -> None:
        """Publish the events hooks queued (``add_message``), oldest first."""
        while run.unpublished:
            await self.publish(run, context, run.unpublished.pop(0))

    async def publish(self, run: RunState, context: AgentRunContext, event: AgentEvent) -> None:
        """Deliver ``event`` to every ``on_event`` hook; an internal message wakes its session.

        Raises:
            Exception: whatever an ``on_event`` hook raised.
        """
        await self.flush(run, context)
        for ext in self.extensions:
            await ext.on_event(context, event)
        await self.flush(run, context)
        if isinstance(event, InternalMessageEvent):
            run.wake(context.config, event)

    async def publish_quietly(
        self, run: RunState, context: AgentRunContext, event: AgentEvent
    ) -> None:
        """Like ``publish``, but what an ``on_event`` hook raises is logged, never raised."""
        try:
            await self.publish(run, context, event)
        except Exception:
            logger.exception("an on_event hook raised while publishing %s", type(event).__name__)

    async def append(self, run: RunState, context: AgentRunContext, message: Message) -> None:
        """Append ``message`` to the session and publish its ``MessageAppendedEvent``."""
        run.append(message)
        await self.publish(run, context, MessageAppendedEvent(context.session_id, message))
