"""The agent runtime: requests turn by turn, every extension hook at its documented moment."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

from zett_agent._context import AgentRunConfig, AgentRunContext
from zett_agent._events import (
    AgentEvent,
    InternalMessageEvent,
    MessageAppendedEvent,
    ModelTextDeltaEvent,
    RunCancelledEvent,
    RunCompletedEvent,
    RunFailedEvent,
    RunStartedEvent,
    ToolCalledEvent,
    ToolFinishedEvent,
    TurnFinishedEvent,
    TurnStartedEvent,
)
from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from zett_agent._model import (
    Model,
    ModelError,
    ModelEvent,
    ModelEventKind,
    ModelRequest,
    ModelResponse,
    RetryOptions,
)
from zett_agent._session import InMemorySessionStore, SessionData, SessionStore
from zett_agent._tools import AgentTool, ToolArgumentError, ToolResult, UnknownToolError
from zett_agent.extensions._base import Extension, closing_stream

__all__ = [
    "Agent",
    "AgentClosedError",
    "AgentError",
    "MaxTurnsExceeded",
    "ModelStreamError",
]

logger = logging.getLogger("zett_agent.agent")

STEERING_SKIP_TEXT = "skipped: interrupted by a steering message"
CANCEL_SKIP_TEXT = "skipped: the request was cancelled"
FAILURE_SKIP_TEXT = "skipped: the request failed before this call finished"


class AgentError(Exception):
    """A request failed because of the runtime's own rules (not a model or hook exception)."""


class MaxTurnsExceeded(AgentError):
    """The request used ``AgentRunConfig.max_turns`` turns without a final answer."""


class AgentClosedError(AgentError):
    """The agent was closed with ``close()``; create a new agent to run more requests."""


class ModelStreamError(AgentError):
    """The model's stream ended without its completed event."""


@dataclasses.dataclass(eq=False)
class _SessionRuntime:
    """Live, non-persistent bookkeeping of one session."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    active: AgentRunContext | None = None
    internal_streak: int = 0
    last_config: AgentRunConfig | None = None


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
        self._extensions = tuple(extensions)
        seen: dict[str, Extension] = {}
        for ext in self._extensions:
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
        base_model_hook = Extension.on_model_request
        base_tool_hook = Extension.on_tool_call
        self._model_wrappers = tuple(
            e for e in self._extensions if type(e).on_model_request is not base_model_hook
        )
        self._tool_wrappers = tuple(
            e for e in self._extensions if type(e).on_tool_call is not base_tool_hook
        )

    # --- properties ---------------------------------------------------------------------------

    @property
    def model(self) -> Model:
        return self._model

    @property
    def extensions(self) -> tuple[Extension, ...]:
        return self._extensions

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
            context = self._new_context(config, None)
            runtime.active = context
            for ext in self._extensions:
                ext._request_started()
            try:
                await self._register_agent_tools(context)
                await self._hooks(context, "on_tool")
                await self._hooks(context, "on_state")
                await self._hooks(context, "on_compact")
            except Exception as error:
                await self._run_on_error(context, error)
                raise
            finally:
                runtime.active = None
                for ext in self._extensions:
                    ext._request_ended()

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
        runtime = self._runtime(config.session_id)
        if runtime.active is not None and runtime.active.input_message is not None:
            runtime.active._steering.append(user_message)
            runtime.active._steered.set()
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
        if runtime.active is not None:
            await self._publish_in(runtime.active, event)
            return
        base = config or runtime.last_config or AgentRunConfig(session_id=event.session_id)
        if base.session_id != event.session_id:
            base = dataclasses.replace(base, session_id=event.session_id)
        await self._publish_in(self._new_context(base, None), event)

    def accept(self, event: Any, *, config: AgentRunConfig | None = None) -> tuple[str, ...]:
        """Broadcast an external event to every extension's ``accept``; return who accepted.

        Every extension is asked, in registration order, whatever the others answered.

        Raises:
            Exception: whatever an ``accept`` hook raised (later extensions are not asked).
        """
        return tuple(ext.name for ext in self._extensions if ext.accept(config, event))

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
        for ext in self._extensions:
            try:
                await ext._agent_closed(self, sessions)
            except Exception:
                logger.exception("%s could not release the sessions of a closed agent", ext.name)

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        names = ", ".join(e.name for e in self._extensions)
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

    def _new_context(
        self, config: AgentRunConfig, message: UserMessage | AgentMessage | None
    ) -> AgentRunContext:
        session: SessionData = self._store.load(config.session_id)
        return AgentRunContext(
            self, config, session, f"req-{next(self._ids)}", message, self._system_prompt
        )

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
        self, config: AgentRunConfig, message: UserMessage | AgentMessage, *, internal: bool
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
            context = self._new_context(config, message)
            runtime.active = context
            for ext in self._extensions:
                ext._request_started()
            cancelled = False
            try:
                return await self._execute(context)
            except asyncio.CancelledError:
                cancelled = True
                raise
            finally:
                runtime.active = None
                for ext in self._extensions:
                    ext._request_ended()
                leftovers, context._steering = context._steering, []
                if leftovers and cancelled:
                    logger.info("request cancelled; %d steering messages dropped", len(leftovers))
                elif not self._closed:
                    for steered in leftovers:
                        # Steering that arrived after the last turn settled starts its own
                        # request rather than being lost.
                        self._spawn(self._request(config, steered, internal=False))

    async def _execute(self, context: AgentRunContext) -> AssistantMessage:
        sid = context.session_id
        try:
            await self._publish_in(context, RunStartedEvent(sid))
            await self._register_agent_tools(context)
            await self._hooks(context, "on_tool")
            await self._hooks(context, "on_state")
            await self._hooks(context, "on_message")
            assert context.input_message is not None
            await self._append(context, context.input_message)
            await self._hooks(context, "before_run")
            final = await self._turns(context)
            await self._hooks(context, "after_run", final)
            await self._hooks(context, "on_success", final)
            await self._publish_in(context, RunCompletedEvent(sid, final))
            return final
        except asyncio.CancelledError:
            self._answer_dangling_calls(context, CANCEL_SKIP_TEXT)
            await self._publish_quietly(context, RunCancelledEvent(sid))
            raise
        except Exception as error:
            self._answer_dangling_calls(context, FAILURE_SKIP_TEXT)
            await self._run_on_error(context, error)
            await self._publish_quietly(
                context, RunFailedEvent(sid, f"{type(error).__name__}: {error}")
            )
            raise

    async def _register_agent_tools(self, context: AgentRunContext) -> None:
        context._owner = "the agent's tools"
        try:
            for agent_tool in self._tools:
                context.register_tool(agent_tool)
        finally:
            context._owner = "the agent"

    async def _hooks(self, context: AgentRunContext, hook: str, *args: Any) -> None:
        for ext in self._extensions:
            context._owner = f"extension {ext.name!r}"
            try:
                await getattr(ext, hook)(context, *args)
            finally:
                context._owner = "the agent"
            await self._flush(context)

    async def _run_on_error(self, context: AgentRunContext, error: BaseException) -> None:
        for ext in self._extensions:
            try:
                await ext.on_error(context, error)
            except Exception:
                logger.exception("on_error of extension %r raised", ext.name)

    async def _flush(self, context: AgentRunContext) -> None:
        while context._unpublished:
            await self._publish_in(context, context._unpublished.pop(0))

    async def _publish_in(self, context: AgentRunContext, event: AgentEvent) -> None:
        await self._flush(context)
        for ext in self._extensions:
            await ext.on_event(context, event)
        await self._flush(context)
        if isinstance(event, InternalMessageEvent):
            self._wake(context.config, event)

    async def _publish_quietly(self, context: AgentRunContext, event: AgentEvent) -> None:
        try:
            await self._publish_in(context, event)
        except Exception:
            logger.exception("an on_event hook raised while publishing %s", type(event).__name__)

    def _wake(self, config: AgentRunConfig, event: InternalMessageEvent) -> None:
        if self._closed:
            logger.warning("agent closed; internal message for %r dropped", event.session_id)
            return
        if config.session_id != event.session_id:
            runtime = self._runtime(event.session_id)
            config = runtime.last_config or dataclasses.replace(config, session_id=event.session_id)
        message = AgentMessage(event.content, event.source or "internal")
        self._spawn(self._request(config, message, internal=True))

    async def _append(self, context: AgentRunContext, message: Message) -> None:
        context._session.messages.append(message)
        context._version += 1
        await self._publish_in(context, MessageAppendedEvent(context.session_id, message))

    def _assemble(self, context: AgentRunContext) -> ModelRequest:
        return ModelRequest(
            messages=context.messages,
            tools=tuple(t.spec for t in context._tools.values()),
            system_prompt=context.system_prompt,
            metadata=context.config.metadata,
        )

    async def _turns(self, context: AgentRunContext) -> AssistantMessage:
        config = context.config
        while True:
            if context.turn >= config.max_turns:
                raise MaxTurnsExceeded(
                    f"no final answer after max_turns={config.max_turns} turns in session "
                    f"{context.session_id!r}; raise AgentRunConfig.max_turns or make the model "
                    "answer without tool calls"
                )
            context.turn += 1
            await self._publish_in(context, TurnStartedEvent(context.session_id, context.turn))
            await self._hooks(context, "before_turn")
            request = self._assemble(context)
            version = context._version
            await self._hooks(context, "before_model", request)
            if context._version != version:
                request = self._assemble(context)
            response = await self._call_model(context, request)
            if response.usage is not None:
                context.usage = context.usage + response.usage
            message = response.message
            await self._append(context, message)
            await self._hooks(context, "after_model", response)
            if message.tool_calls:
                await self._run_tools(context, message.tool_calls)
            steered, context._steering = context._steering, []
            context._steered.clear()
            for user_message in steered:
                await self._append(context, user_message)
            await self._hooks(context, "after_turn", message)
            await self._publish_in(
                context, TurnFinishedEvent(context.session_id, context.turn, response.usage)
            )
            if not message.tool_calls and not steered:
                return message

    # --- the model call -----------------------------------------------------------------------

    def _model_chain(
        self, context: AgentRunContext, index: int
    ) -> Callable[[ModelRequest], AsyncIterator[ModelEvent]]:
        if index == len(self._model_wrappers):
            return self._model.stream
        wrapper = self._model_wrappers[index]
        inner = self._model_chain(context, index + 1)

        def call_next(request: ModelRequest) -> AsyncIterator[ModelEvent]:
            return wrapper.on_model_request(context, request, inner)

        return call_next

    async def _call_model(self, context: AgentRunContext, request: ModelRequest) -> ModelResponse:
        retry: RetryOptions = getattr(self._model, "retry", None) or RetryOptions(max_retries=0)
        attempt = 0
        while True:
            completed: ModelResponse | None = None
            try:
                async with closing_stream(self._model_chain(context, 0)(request)) as stream:
                    async for event in stream:
                        if event.kind is ModelEventKind.TEXT_DELTA:
                            await self._publish_in(
                                context, ModelTextDeltaEvent(context.session_id, event.text)
                            )
                        elif event.kind is ModelEventKind.COMPLETED:
                            completed = event.response
                if completed is None:
                    raise ModelStreamError(
                        f"the stream of {type(self._model).__name__} ended without a completed "
                        "event; a model must yield ModelEvent.completed(response) last"
                    )
                return completed
            except ModelError as error:
                if completed is not None or not error.retryable or attempt >= retry.max_retries:
                    raise
                attempt += 1
                delay = retry.delay(attempt)
                logger.info(
                    "model call failed (%s); retry %d/%d in %.2fs",
                    error,
                    attempt,
                    retry.max_retries,
                    delay,
                )
                await asyncio.sleep(delay)

    # --- tools --------------------------------------------------------------------------------

    async def _run_tools(self, context: AgentRunContext, calls: Sequence[ToolCall]) -> None:
        results: list[ToolMessage | None] = [None] * len(calls)
        tasks: list[asyncio.Task[ToolMessage]] = []
        if not context._steering:
            loop = asyncio.get_running_loop()
            tasks = [loop.create_task(self._run_call(context, call)) for call in calls]
            steered = loop.create_task(context._steered.wait())
            try:
                remaining: set[asyncio.Future[Any]] = set(tasks)
                while remaining:
                    done, _ = await asyncio.wait(
                        remaining | {steered}, return_when=asyncio.FIRST_COMPLETED
                    )
                    remaining -= done
                    if steered in done or any(
                        t is not steered and t.exception() is not None for t in done
                    ):
                        break
            except asyncio.CancelledError:
                await self._stop_tasks([*tasks, steered])
                self._record_settled(context, calls, tasks)
                raise
            await self._stop_tasks([*tasks, steered])
            errors = [t.exception() for t in tasks if not t.cancelled() and t.exception()]
            if errors:
                raise errors[0]  # type: ignore[misc]
            for index, task in enumerate(tasks):
                if not task.cancelled():
                    results[index] = task.result()
        for index, call in enumerate(calls):
            message = results[index]
            if message is None:
                message = ToolMessage(call.id, call.name, STEERING_SKIP_TEXT, ToolStatus.SKIPPED)
                await self._publish_in(
                    context, ToolFinishedEvent(context.session_id, call, message)
                )
            await self._append(context, message)

    @staticmethod
    async def _stop_tasks(tasks: Sequence[asyncio.Task[Any]]) -> None:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    @staticmethod
    def _record_settled(
        context: AgentRunContext,
        calls: Sequence[ToolCall],
        tasks: Sequence[asyncio.Task[ToolMessage]],
    ) -> None:
        """Keep the results of calls that completed before the batch was cancelled."""
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is None:
                context._session.messages.append(task.result())

    @staticmethod
    def _answer_dangling_calls(context: AgentRunContext, text: str) -> None:
        """Answer every unanswered call of the last assistant message as skipped.

        A request that ends in the middle of a turn would otherwise leave tool calls without
        results, which providers reject on the session's next request.
        """
        messages = context._session.messages
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if isinstance(message, AssistantMessage):
                answered = {m.call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
                for call in message.tool_calls:
                    if call.id not in answered:
                        messages.append(ToolMessage(call.id, call.name, text, ToolStatus.SKIPPED))
                return

    def _tool_chain(
        self, context: AgentRunContext, tool: AgentTool, index: int
    ) -> Callable[[ToolCall], Awaitable[ToolResult]]:
        if index == len(self._tool_wrappers):

            async def invoke(call: ToolCall) -> ToolResult:
                target = context._tools.get(call.name, tool)
                return await target.invoke(call.arguments)

            return invoke
        wrapper = self._tool_wrappers[index]
        inner = self._tool_chain(context, tool, index + 1)

        async def call_next(call: ToolCall) -> ToolResult:
            result = await wrapper.on_tool_call(context, call, inner)
            return result if isinstance(result, ToolResult) else ToolResult(result)

        return call_next

    async def _run_call(self, context: AgentRunContext, call: ToolCall) -> ToolMessage:
        await self._hooks(context, "before_tool", call)
        await self._publish_in(context, ToolCalledEvent(context.session_id, call))
        tool = context._tools.get(call.name)
        error: BaseException | None = None
        if tool is None:
            error = UnknownToolError(call.name, list(context._tools))
            result = ToolResult.error(str(error))
        else:
            try:
                result = await self._tool_chain(context, tool, 0)(call)
            except ToolArgumentError as exc:
                error, result = exc, ToolResult.error(str(exc))
            except MemoryError:
                # Out of memory is the process's state, not the tool's answer: the request
                # fails, so a child agent under a memory limit reports the limit it hit.
                raise
            except Exception as exc:
                error = exc
                result = ToolResult.error(f"{tool.name} failed: {type(exc).__name__}: {exc}")
        # after_tool may edit the result in place (the seed's contract); it edits a copy, so a
        # handler that returns one shared ToolResult object keeps it unchanged for later calls
        result = ToolResult(result.content, result.is_error)
        for ext in self._extensions:
            replaced = await ext.after_tool(context, call, result, error)
            if isinstance(replaced, ToolResult):
                result = replaced
            await self._flush(context)
        status = ToolStatus.FAILED if result.is_error else ToolStatus.OK
        message = ToolMessage(call.id, call.name, result.text, status)
        await self._publish_in(context, ToolFinishedEvent(context.session_id, call, message))
        return message
