"""One request: how it runs, what it shows its hooks, and the runtime's own state of it.

``AgentRunConfig``, ``AgentRunContext`` and ``RunState``.

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
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from zett_agent._events import AgentEvent, MessageAppendedEvent
from zett_agent._messages import AgentMessage, Message, UserMessage
from zett_agent._model import Model, Usage
from zett_agent._tools import AgentTool

if TYPE_CHECKING:
    from zett_agent._events import InternalMessageEvent
    from zett_agent._runtime._agent import Agent
    from zett_agent._session import SessionData
    from zett_agent._tracing._base import Tracer

__all__ = ["AgentRunConfig", "AgentRunContext", "RunState"]


@dataclass(frozen=True, slots=True)
class AgentRunConfig:
    """How one request runs.

    ``session_id`` selects the conversation; ``max_turns`` bounds model calls per request
    (exceeding it raises ``MaxTurnsExceeded``); ``max_internal_continuations`` bounds how many
    requests ``InternalMessageEvent`` may start in a row without an external ``run``;
    ``metadata`` is passed to the model in ``ModelRequest.metadata``.
    """

    session_id: str = "default"
    max_turns: int = 20
    max_internal_continuations: int = 8
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.session_id:
            raise ValueError("session_id must be a non-empty string")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_internal_continuations < 0:
            raise ValueError(
                f"max_internal_continuations must be >= 0, got {self.max_internal_continuations}"
            )


class AgentRunContext:
    """Everything one request (or one ``compact``) works on; hooks receive it.

    Created by the agent, one per request. Messages and session state are the session's own:
    changes persist after the request, also when it fails or is cancelled.
    """

    def __init__(
        self,
        agent: Agent,
        config: AgentRunConfig,
        run: RunState,
        request_id: str,
        input_message: UserMessage | AgentMessage | None,
        system_prompt: str | None,
    ) -> None:
        self._agent = agent
        self._config = config
        self._run = run
        self._request_id = request_id
        self._input_message = input_message
        self._system_prompt = system_prompt
        self.turn = 0
        """The current turn, 1-based; 0 before the first turn."""
        self.usage = Usage()
        """Tokens used by this request's model calls so far."""

    # --- identity -----------------------------------------------------------------------------

    @property
    def agent(self) -> Agent:
        return self._agent

    @property
    def config(self) -> AgentRunConfig:
        return self._config

    @property
    def session_id(self) -> str:
        return self._config.session_id

    @property
    def request_id(self) -> str:
        """Unique per request (``compact`` passes get one too)."""
        return self._request_id

    @property
    def model(self) -> Model:
        """The agent's model."""
        return self._agent.model

    # --- input and conversation ---------------------------------------------------------------

    @property
    def input_message(self) -> UserMessage | AgentMessage | None:
        """The request's input before it is appended; ``on_message`` may replace it.

        ``None`` during ``compact``.
        """
        return self._input_message

    @input_message.setter
    def input_message(self, message: UserMessage | AgentMessage) -> None:
        if not isinstance(message, UserMessage | AgentMessage):
            raise TypeError(
                f"input_message must be a UserMessage or AgentMessage, got {type(message).__name__}"
            )
        self._input_message = message

    @property
    def messages(self) -> tuple[Message, ...]:
        """The session's conversation so far (a snapshot)."""
        return tuple(self._run.session.messages)

    def add_message(self, message: Message) -> None:
        """Append a message to the session.

        A ``MessageAppendedEvent`` for it is published when the current hook returns.
        """
        self._run.append(message)
        self._run.unpublished.append(MessageAppendedEvent(self.session_id, message))

    def replace_messages(self, messages: Iterable[Message]) -> None:
        """Replace the whole conversation (for example with a summary); publishes nothing."""
        self._run.session.messages[:] = list(messages)
        self._run.version += 1

    # --- system prompt and tools --------------------------------------------------------------

    @property
    def system_prompt(self) -> str | None:
        """The system prompt of the next model call; starts as the agent's."""
        return self._system_prompt

    @system_prompt.setter
    def system_prompt(self, value: str | None) -> None:
        self._system_prompt = value
        self._run.version += 1

    @property
    def tools(self) -> Mapping[str, AgentTool]:
        """The tools registered for this request, by name (read-only view)."""
        return MappingProxyType(self._run.tools)

    def register_tool(self, tool: AgentTool) -> None:
        """Offer ``tool`` to the model for the rest of this request.

        Raises:
            ValueError: a tool of the same name is already registered; the message names
                who registered both.
            TypeError: ``tool`` is not an ``AgentTool``.
        """
        if not isinstance(tool, AgentTool):
            raise TypeError(f"register_tool expects an AgentTool, got {type(tool).__name__}")
        self._run.register_tool(tool)

    # --- state and events ---------------------------------------------------------------------

    @property
    def state(self) -> dict[str, dict[str, Any]]:
        """The session's persistent state: one dictionary per extension name."""
        return self._run.session.state

    def session_state(self, name: str) -> dict[str, Any]:
        """The persistent state dictionary of one extension (created empty on first use)."""
        return self._run.session.state.setdefault(name, {})

    async def publish(self, event: AgentEvent) -> None:
        """Publish ``event`` to every extension's ``on_event`` (see ``Agent.publish``).

        Raises:
            Exception: whatever an ``on_event`` hook raises.
        """
        await self._run.publish(self._run, self, event)

    @property
    def steering_pending(self) -> bool:
        """True when a steering message waits to be appended."""
        return bool(self._run.steering)

    def __repr__(self) -> str:
        return (
            f"<AgentRunContext session={self.session_id!r} request={self._request_id} "
            f"turn={self.turn}>"
        )


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
