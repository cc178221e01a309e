"""The agent: its sessions, one request at a time per session, and its public operations.

``Agent`` keeps each session's lock, running request and continuation count, starts and
cancels its background requests, and makes the ``RunState`` of every request it runs. How a
request runs lives in companions the agent owns: its course turn by turn (``_turns``), the
model call (``_model_call``), the tool batch (``_tool_batch``) and the extensions' hooks and
events (``_hooks``). ``add_extension``, ``steerable`` and ``continue_request`` are the narrow
interface the child runtime (``zett_agent.runners``, ``zett_agent.extensions``) uses on an
agent it did not build.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

from zett_agent._events import AgentEvent, InternalMessageEvent
from zett_agent._messages import AgentMessage, AssistantMessage, Message, UserMessage
from zett_agent._model import Model
from zett_agent._runtime._context import AgentRunConfig, AgentRunContext, RunState
from zett_agent._runtime._errors import (
    AgentClosedError,
    AgentError,
    MaxTurnsExceeded,
    ModelStreamError,
)
from zett_agent._runtime._extension import Extension, request_ended, request_started
from zett_agent._runtime._hooks import Hooks
from zett_agent._runtime._model_call import ModelCall
from zett_agent._runtime._tool_batch import ToolBatch
from zett_agent._runtime._turns import Turns
from zett_agent._session import InMemorySessionStore, SessionData, SessionStore
from zett_agent._tools import AgentTool
from zett_agent._tracing import _tracer as _tracing

__all__ = [
    "Agent",
    "AgentClosedError",
    "AgentError",
    "MaxTurnsExceeded",
    "ModelStreamError",
    "add_extension",
    "continue_request",
    "steerable",
]

logger = logging.getLogger("zett_agent.agent")


@dataclasses.dataclass(eq=False)
class _SessionRuntime:
    """Live, non-persistent bookkeeping of one session."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    #: the running request (or compact), and its state
    active: AgentRunContext | None = None
    run: RunState | None = None
    internal_streak: int = 0
    last_config: AgentRunConfig | None = None
    #: the running one is a ``compact``, not a request
    compacting: bool = False

    def steerable(self) -> RunState | None:
        """The state of the running request ``steer`` steers (a ``compact`` is not one)."""
        return self.run if self.active is not None and not self.compacting else None


class Agent:
    """An LLM agent: runs requests turn by turn and calls its extensions' hooks.

    ``model`` answers each turn; ``extensions`` are called in registration order (the first
    is the outermost layer of the ``on_model_request`` and ``on_tool_call`` chains);
    ``tools`` are registered for every request before any ``on_tool`` hook;
    ``system_prompt`` is where ``context.system_prompt`` starts; ``session_store`` keeps the
    sessions (in memory by default).

    Requests of one session run one after another (a per-session lock, first come first
    served); requests of different sessions run concurrently.

    Raises:
        ValueError: two extensions share a ``name`` (assign ``ext.name`` to tell them apart).
        TypeError: an extension is not an ``Extension``.
    """

    def __init__(
        self,
        model: Model,
        *,
        extensions: Iterable[Extension] = (),
        tools: Iterable[AgentTool] = (),
        system_prompt: str | None = None,
        session_store: SessionStore | None = None,
    ) -> None:
        self._model = model
        extensions = tuple(extensions)
        seen: dict[str, Extension] = {}
        for ext in extensions:
            if not isinstance(ext, Extension):
                raise TypeError(f"extensions must be Extension instances, got {ext!r}")
            if ext.name in seen:
                raise ValueError(
                    f"two extensions are named {ext.name!r} ({seen[ext.name]!r} and {ext!r}); "
                    "assign a distinct ext.name to register both"
                )
            seen[ext.name] = ext
        self._tools = tuple(tools)
        self._system_prompt = system_prompt
        self._store: SessionStore = session_store or InMemorySessionStore()
        self._sessions: dict[str, _SessionRuntime] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._ids = itertools.count(1)
        self._hooks = Hooks(extensions)
        base_model_hook = Extension.on_model_request
        base_tool_hook = Extension.on_tool_call
        model_wrappers = tuple(
            e for e in extensions if type(e).on_model_request is not base_model_hook
        )
        tool_wrappers = tuple(e for e in extensions if type(e).on_tool_call is not base_tool_hook)
        self._turns = Turns(
            self._hooks,
            ModelCall(model, model_wrappers, self._hooks),
            ToolBatch(tool_wrappers, self._hooks),
            self._tools,
        )

    # --- properties ---------------------------------------------------------------------------

    @property
    def model(self) -> Model:
        return self._model

    @property
    def extensions(self) -> tuple[Extension, ...]:
        return self._hooks.extensions

    @property
    def tools(self) -> tuple[AgentTool, ...]:
        """The agent-level tools registered for every request."""
        return self._tools

    @property
    def system_prompt(self) -> str | None:
        return self._system_prompt

    @property
    def session_store(self) -> SessionStore:
        return self._store

    @property
    def closed(self) -> bool:
        return self._closed

    def messages(self, session_id: str = "default") -> tuple[Message, ...]:
        """A snapshot of one session's conversation."""
        return tuple(self._store.load(session_id).messages)

    def busy(self, session_id: str = "default") -> bool:
        """True while a request (or ``compact``) of the session runs."""
        runtime = self._sessions.get(session_id)
        return runtime is not None and runtime.active is not None

    # --- public operations --------------------------------------------------------------------

    async def run(
        self, input: str | UserMessage, *, config: AgentRunConfig | None = None
    ) -> AssistantMessage:
        """Run one request of ``config.session_id`` and return the final assistant message.

        Waits for earlier requests of the same session to finish first.

        Raises:
            MaxTurnsExceeded: no final answer within ``config.max_turns`` turns.
            AgentClosedError: the agent was closed.
            ModelError: the model failed and retries (per ``model.retry``) were exhausted.
            Exception: whatever a hook raised. Every error reaches the caller after the
                ``on_error`` hooks ran and ``RunFailedEvent`` was published.

        Cancellation: cancelling the caller cancels the request: running tools are cancelled
        (their calls are recorded as skipped), ``RunCancelledEvent`` is published, the
        incomplete turn gets no ``after_turn``, and ``CancelledError`` propagates.
        """
        config = config or AgentRunConfig()
        message = UserMessage(input) if isinstance(input, str) else input
        result = await self._request(config, message, internal=False)
        assert result is not None  # external requests are never dropped
        return result

    async def compact(self, *, config: AgentRunConfig | None = None) -> None:
        """Restore the session through ``on_tool`` and ``on_state``, then run ``on_compact``.

        Appends no input and makes no model call. Waits for the session's running request.

        Raises:
            AgentClosedError: the agent was closed.
            Exception: whatever a hook raised, after the ``on_error`` hooks ran.

        Cancellation: propagates; no event is published.
        """
        config = config or AgentRunConfig()
        runtime = self._runtime(config.session_id)
        async with runtime.lock:
            self._check_open()
            run, context = self._new_run(config, None)
            runtime.active, runtime.run = context, run
            runtime.compacting = True
            extensions = self._hooks.extensions
            request_started(extensions)
            try:
                await self._turns.compact(run, context)
            finally:
                runtime.active = runtime.run = None
                runtime.compacting = False
                request_ended(extensions)

    def steer(self, message: str | UserMessage, *, config: AgentRunConfig | None = None) -> bool:
        """Send a message into the session's running request.

        Returns True when a request of the session is running: the message interrupts its
        current tool batch (calls still running are cancelled, calls not yet run are not
        started; both are answered as skipped), is appended before that turn's
        ``after_turn``, and the model sees it in the next turn. Returns False when the
        session is idle: a new request with this message starts in the background (owned by
        the agent, cancelled by ``close()``; its errors are logged).

        Raises:
            AgentClosedError: the agent was closed.
        """
        self._check_open()
        config = config or AgentRunConfig()
        user_message = UserMessage(message) if isinstance(message, str) else message
        run = self._runtime(config.session_id).steerable()
        if run is not None:
            run.steer(user_message)
            return True
        self._spawn(self._request(config, user_message, internal=False))
        return False

    async def publish(self, event: AgentEvent, *, config: AgentRunConfig | None = None) -> None:
        """Deliver ``event`` to every extension's ``on_event`` for ``event.session_id``.

        An ``InternalMessageEvent`` also starts a background request of that session with
        ``AgentMessage(event.content, event.source or "internal")`` as input: at once when the
        session is idle, after the current request otherwise. Consecutive internal requests
        without an external ``run`` are limited by ``config.max_internal_continuations``;
        beyond it the request is dropped with a logged warning. ``config`` (default: the
        session's last config) configures that request.

        Raises:
            AgentClosedError: the agent was closed.
            Exception: whatever an ``on_event`` hook raised.
        """
        self._check_open()
        runtime = self._runtime(event.session_id)
        if runtime.active is not None and runtime.run is not None:
            await self._hooks.publish(runtime.run, runtime.active, event)
            return
        base = config or runtime.last_config or AgentRunConfig(session_id=event.session_id)
        if base.session_id != event.session_id:
            base = dataclasses.replace(base, session_id=event.session_id)
        await self._hooks.publish(*self._new_run(base, None), event)

    def accept(self, event: Any, *, config: AgentRunConfig | None = None) -> tuple[str, ...]:
        """Broadcast an external event to every extension's ``accept``; return who accepted.

        Every extension is asked, in registration order, whatever the others answered.

        Raises:
            Exception: whatever an ``accept`` hook raised (later extensions are not asked).
        """
        return tuple(ext.name for ext in self._hooks.extensions if ext.accept(config, event))

    async def wait_idle(self) -> None:
        """Wait until no background request (steered or internal) of this agent runs.

        Cancellation: only the wait is cancelled, not the requests.
        """
        while self._background:
            await asyncio.wait(set(self._background))

    async def close(self) -> None:
        """Cancel the agent's background requests and wait for them; idempotent.

        Requests awaited by callers of ``run`` are not cancelled (cancel those callers).
        Afterwards ``run``, ``compact``, ``steer`` and ``publish`` raise ``AgentClosedError``.
        Then each extension is told which sessions this agent ran, once, so it can release
        what it keeps for them (``AsyncSubAgentExtension`` cancels their background tasks and
        forgets them, unless another open agent uses the session too); an extension's error
        there is logged. If the caller is cancelled meanwhile, what was not released yet stays
        (the extension's own ``close()`` still ends everything).
        """
        first = not self._closed
        self._closed = True
        while self._background:
            tasks = set(self._background)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
        if not first:
            return
        sessions = frozenset(self._sessions)
        for ext in self._hooks.extensions:
            try:
                await ext.on_agent_closed(self, sessions)
            except Exception:
                logger.exception("%s could not release the sessions of a closed agent", ext.name)

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        names = ", ".join(e.name for e in self._hooks.extensions)
        return f"<Agent model={type(self._model).__name__} extensions=[{names}]>"

    # --- request machinery --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise AgentClosedError("the agent is closed; create a new agent to run requests")

    def _runtime(self, session_id: str) -> _SessionRuntime:
        runtime = self._sessions.get(session_id)
        if runtime is None:
            runtime = self._sessions[session_id] = _SessionRuntime()
        return runtime

    def _new_run(
        self, config: AgentRunConfig, message: UserMessage | AgentMessage | None
    ) -> tuple[RunState, AgentRunContext]:
        session: SessionData = self._store.load(config.session_id)
        run = RunState(session, self._hooks.publish, self._wake)
        context = AgentRunContext(
            self, config, run, f"req-{next(self._ids)}", message, self._system_prompt
        )
        return run, context

    def _new_context(
        self, config: AgentRunConfig, message: UserMessage | AgentMessage | None
    ) -> AgentRunContext:
        """A context of a new request state (for tests that call hooks by hand)."""
        return self._new_run(config, message)[1]

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not isinstance(error, AgentClosedError):
            logger.error("background agent request failed", exc_info=error)

    async def _request(
        self,
        config: AgentRunConfig,
        message: UserMessage | AgentMessage | None,
        *,
        internal: bool,
        turn: int = 0,
    ) -> AssistantMessage | None:
        runtime = self._runtime(config.session_id)
        async with runtime.lock:
            self._check_open()
            if internal:
                if runtime.internal_streak >= config.max_internal_continuations:
                    logger.warning(
                        "dropped an internal message for session %r: %d internal requests ran "
                        "in a row without an external run (max_internal_continuations=%d)",
                        config.session_id,
                        runtime.internal_streak,
                        config.max_internal_continuations,
                    )
                    return None
                runtime.internal_streak += 1
            else:
                runtime.internal_streak = 0
            runtime.last_config = config
            run, context = self._new_run(config, message)
            context.turn = turn  # a continuation counts the turns its request made before
            run.tracer = (
                _tracing.current()
            )  # None unless tracing is on (zett_agent._tracing._tracer)
            runtime.active, runtime.run = context, run
            extensions = self._hooks.extensions
            request_started(extensions)
            cancelled = False
            try:
                if run.tracer is not None:
                    execute = functools.partial(self._turns.execute, run)
                    return await _tracing.request(run.tracer, context, execute)
                return await self._turns.execute(run, context)
            except asyncio.CancelledError:
                cancelled = True
                raise
            finally:
                runtime.active = runtime.run = None
                request_ended(extensions)
                leftovers, run.steering = run.steering, []
                if leftovers and cancelled:
                    logger.info("request cancelled; %d steering messages dropped", len(leftovers))
                elif not self._closed:
                    for steered in leftovers:
                        # Steering that arrived after the last turn settled starts its own
                        # request rather than being lost.
                        self._spawn(self._request(config, steered, internal=False))

    def _wake(self, config: AgentRunConfig, event: InternalMessageEvent) -> None:
        if self._closed:
            logger.warning("agent closed; internal message for %r dropped", event.session_id)
            return
        if config.session_id != event.session_id:
            runtime = self._runtime(event.session_id)
            config = runtime.last_config or dataclasses.replace(config, session_id=event.session_id)
        message = AgentMessage(event.content, event.source or "internal")
        self._spawn(self._request(config, message, internal=True))


# --- for the child runtime ---------------------------------------------------------------------


def add_extension(agent: Agent, extension: Extension) -> None:
    """Register ``extension`` last on ``agent``, after the agent was built.

    For the child's ``ChildInbox``, added to whatever agent the user's ``_create_child`` built.
    ``extension`` must wrap neither model requests nor tool calls (its ``on_model_request``
    and ``on_tool_call`` are not called); requests that start afterwards call its other hooks.
    """
    hooks = agent._hooks
    hooks.extensions = (*hooks.extensions, extension)


async def continue_request(
    agent: Agent, config: AgentRunConfig, *, turns_done: int = 0
) -> AssistantMessage:
    """Run a request of ``config.session_id`` that goes on from its conversation as it is.

    For a child that resumes the request a dead process left (its messages restored into the
    session first): no input is appended and ``on_message`` is not called; the calls of the
    last assistant message that have no result yet run first (as that turn's tool batch,
    followed by its ``after_turn``), then turns go on as in ``Agent.run``. ``turns_done`` is
    how many turns the request had made: ``config.max_turns`` counts them.

    Raises and cancels as ``Agent.run`` does.
    """
    result = await agent._request(config, None, internal=False, turn=turns_done)
    assert result is not None  # a continuation is never dropped
    return result


def steerable(agent: Agent, session_id: str) -> bool:
    """Whether ``agent.steer`` would steer a running request of ``session_id`` now.

    False when the session is idle or runs a ``compact``: then ``steer`` starts a request of
    its own.
    """
    runtime = agent._sessions.get(session_id)
    return runtime is not None and runtime.steerable() is not None
