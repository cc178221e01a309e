"""The request loop around the hooks: retries, limits, cancellation, sessions, wake-ups."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.calls import call, calls, tool_call
from support.recorders import EventLog, Recorder, cancelled_once, echo
from zett_agent.agent import (
    Agent,
    AgentClosedError,
    AgentRunConfig,
    AgentRunContext,
    MaxTurnsExceeded,
    ModelStreamError,
)
from zett_agent.events import AgentEvent, InternalMessageEvent, RunCompletedEvent
from zett_agent.extensions import Extension
from zett_agent.messages import AgentMessage, AssistantMessage, ToolMessage, ToolStatus, UserMessage
from zett_agent.model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    RetryOptions,
    TransientModelError,
)
from zett_agent.testing import FunctionModel, ScriptedModel, ScriptExhaustedError
from zett_agent.tools import tool

# --- retries ----------------------------------------------------------------------------------


async def test_transient_model_errors_are_retried_with_the_configured_delays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float, result: Any = None) -> Any:
        delays.append(delay)
        return await real_sleep(0, result)

    monkeypatch.setattr("zett_agent._runtime._agent.asyncio.sleep", fake_sleep)
    retry = RetryOptions(max_retries=3, initial_delay=0.5, backoff=2.0, max_delay=0.75)
    model = ScriptedModel(
        [TransientModelError("503"), ModelError("429", retryable=True), "finally"], retry=retry
    )
    agent = Agent(model)

    assert (await agent.run("go")).content == "finally"
    assert delays == [0.5, 0.75]
    assert len(model.requests) == 3


async def test_retries_are_bounded_and_the_last_error_reaches_the_caller() -> None:
    retry = RetryOptions(max_retries=1, initial_delay=0)
    model = ScriptedModel([TransientModelError("a"), TransientModelError("b"), "x"], retry=retry)
    with pytest.raises(TransientModelError, match="b"):
        await Agent(model).run("go")
    assert len(model.requests) == 2


async def test_non_retryable_errors_are_not_retried() -> None:
    model = ScriptedModel([ModelError("bad request", status=400), "x"], retry=RetryOptions(3, 0))
    with pytest.raises(ModelError, match="bad request"):
        await Agent(model).run("go")
    assert len(model.requests) == 1


async def test_a_failure_after_the_completed_event_is_not_retried() -> None:
    attempts: list[int] = []

    class LateFailure:
        retry = RetryOptions(max_retries=3, initial_delay=0)

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            attempts.append(1)
            yield ModelEvent.completed(ModelResponse(AssistantMessage("done")))
            raise TransientModelError("connection reset after the answer")

    with pytest.raises(TransientModelError):
        await Agent(LateFailure()).run("go")
    assert len(attempts) == 1


async def test_a_stream_without_completed_event_is_a_clear_error() -> None:
    class Silent:
        retry = RetryOptions(max_retries=0)

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            yield ModelEvent.text_delta("hello")

    with pytest.raises(ModelStreamError, match="without a completed event"):
        await Agent(Silent()).run("go")


async def test_a_scripted_model_that_runs_out_says_so() -> None:
    with pytest.raises(ScriptExhaustedError, match="only 1 responses"):
        await Agent(ScriptedModel([call("echo", text="a")]), tools=[echo]).run("go")


# --- max_turns --------------------------------------------------------------------------------


async def test_max_turns_raises_through_on_error() -> None:
    log: list[tuple[str, str]] = []
    model = FunctionModel(lambda request: call("echo", text="again"))
    agent = Agent(model, tools=[echo], extensions=[Recorder(log)])

    with pytest.raises(MaxTurnsExceeded, match="max_turns=3"):
        await agent.run("loop", config=AgentRunConfig(max_turns=3))

    assert len(model.requests) == 3
    assert log[-1] == ("Recorder.on_error", "MaxTurnsExceeded")


# --- tools ------------------------------------------------------------------------------------


async def test_tool_calls_of_one_turn_run_concurrently_and_results_keep_call_order() -> None:
    first_started = asyncio.Event()
    second_started = asyncio.Event()

    @tool
    async def first() -> str:
        """First."""
        first_started.set()
        await second_started.wait()  # deadlocks unless both run at once
        return "one"

    @tool
    async def second() -> str:
        """Second."""
        second_started.set()
        await first_started.wait()
        return "two"

    model = ScriptedModel(
        [calls(tool_call("second", call_id="b"), tool_call("first", call_id="a")), "done"]
    )
    agent = Agent(model, tools=[first, second])
    await agent.run("go")

    results = [m for m in agent.messages() if isinstance(m, ToolMessage)]
    assert [(m.call_id, m.text) for m in results] == [("b", "two"), ("a", "one")]


async def test_bad_arguments_become_a_failed_tool_message_the_model_can_act_on() -> None:
    @tool
    def repeat(text: str, times: int = 1) -> str:
        """Repeat text.

        Args:
            text: What to repeat.
            times: How often.
        """
        return text * times

    model = ScriptedModel([call("repeat", times="3"), "done"])
    agent = Agent(model, tools=[repeat])
    assert (await agent.run("go")).content == "done"

    [message] = [m for m in agent.messages() if isinstance(m, ToolMessage)]
    assert message.status is ToolStatus.FAILED
    assert "missing required argument 'text' (What to repeat.)" in message.text
    assert "argument 'times' must be an integer, got string \"3\"" in message.text
    assert "call 'repeat' again" in message.text


async def test_handler_exceptions_become_failed_tool_messages() -> None:
    @tool
    def crash() -> str:
        """Crash."""
        raise KeyError("k")

    agent = Agent(ScriptedModel([call("crash"), "done"]), tools=[crash])
    await agent.run("go")
    [message] = [m for m in agent.messages() if isinstance(m, ToolMessage)]
    assert message.text == "crash failed: KeyError: 'k'" and message.failed


# --- cancellation -----------------------------------------------------------------------------


async def test_cancelling_the_caller_cancels_tools_and_publishes_run_cancelled() -> None:
    started = asyncio.Event()
    tool_cancelled = asyncio.Event()
    log: list[tuple[str, str]] = []
    events = EventLog()

    @tool
    async def wait_forever() -> str:
        """Wait."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            tool_cancelled.set()
            raise
        return "never"

    agent = Agent(
        ScriptedModel([call("wait_forever"), "unused"]),
        tools=[wait_forever],
        extensions=[Recorder(log), events],
    )
    await cancelled_once(agent, started)

    assert tool_cancelled.is_set()
    assert events.types()[-1] == "RUN_CANCELLED"
    hooks = [h for h, _ in log]
    assert "Recorder.after_turn" not in hooks and "Recorder.on_error" not in hooks
    # the conversation stays well-formed: every call has an answer
    last = agent.messages()[-1]
    assert isinstance(last, ToolMessage) and last.status is ToolStatus.SKIPPED
    assert not agent.busy()


# --- sessions ---------------------------------------------------------------------------------


async def test_sessions_keep_separate_conversations_and_state() -> None:
    model = ScriptedModel(["a1", "b1", "a2"])
    agent = Agent(model)
    await agent.run("first a", config=AgentRunConfig(session_id="a"))
    await agent.run("first b", config=AgentRunConfig(session_id="b"))
    await agent.run("second a", config=AgentRunConfig(session_id="a"))

    assert model.requests[2].messages == (
        UserMessage("first a"),
        AssistantMessage("a1"),
        UserMessage("second a"),
    )
    assert agent.messages("b") == (UserMessage("first b"), AssistantMessage("b1"))


async def test_requests_of_one_session_are_serialized() -> None:
    entered: list[str] = []
    first_entered = asyncio.Event()
    release = asyncio.Event()

    async def answer(request: ModelRequest) -> str:
        text = request.messages[-1]
        assert isinstance(text, UserMessage)
        entered.append(text.content)
        if text.content == "one":
            first_entered.set()
            await release.wait()
        return f"re {text.content}"

    agent = Agent(FunctionModel(answer))
    one = asyncio.create_task(agent.run("one"))
    await first_entered.wait()
    two = asyncio.create_task(agent.run("two"))
    for _ in range(5):  # give "two" every chance to (wrongly) enter
        await asyncio.sleep(0)
    assert entered == ["one"]
    release.set()
    assert (await one).content == "re one" and (await two).content == "re two"
    assert entered == ["one", "two"]


async def test_requests_of_different_sessions_run_concurrently() -> None:
    entered = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def answer(request: ModelRequest) -> str:
        session = request.metadata["session"]
        entered[session].set()
        other = "b" if session == "a" else "a"
        await entered[other].wait()  # deadlocks unless both sessions run at once
        return session

    agent = Agent(FunctionModel(answer))
    results = await asyncio.gather(
        agent.run("x", config=AgentRunConfig(session_id="a", metadata={"session": "a"})),
        agent.run("y", config=AgentRunConfig(session_id="b", metadata={"session": "b"})),
    )
    assert [r.content for r in results] == ["a", "b"]


# --- internal messages and steering when idle -------------------------------------------------


class Completions(Extension):
    """Signals each RUN_COMPLETED with its input, for waiting without sleeps."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.changed = asyncio.Event()

    async def on_event(self, context: AgentRunContext, event: AgentEvent) -> None:
        if isinstance(event, RunCompletedEvent):
            self.inputs.append(context.input_message)
            self.changed.set()

    async def wait_for(self, count: int) -> None:
        while len(self.inputs) < count:
            self.changed.clear()
            await self.changed.wait()


async def test_internal_message_wakes_an_idle_session_with_an_agent_message() -> None:
    done = Completions()
    model = ScriptedModel(["woke up"])
    agent = Agent(model, extensions=[done])
    try:
        await agent.publish(InternalMessageEvent("s", "task 7 finished", source="tasks"))
        await done.wait_for(1)
    finally:
        await agent.close()

    assert done.inputs == [AgentMessage("task 7 finished", source="tasks")]
    assert agent.messages("s") == (
        AgentMessage("task 7 finished", source="tasks"),
        AssistantMessage("woke up"),
    )


async def test_internal_message_for_a_busy_session_runs_after_the_current_request() -> None:
    done = Completions()
    release = asyncio.Event()
    entered = asyncio.Event()

    async def answer(request: ModelRequest) -> str:
        if len(request.messages) == 1:
            entered.set()
            await release.wait()
            return "external done"
        return "internal done"

    agent = Agent(FunctionModel(answer), extensions=[done])
    try:
        run = asyncio.create_task(agent.run("work"))
        await entered.wait()
        await agent.publish(InternalMessageEvent("default", "ping"))
        assert agent.busy()
        release.set()
        assert (await run).content == "external done"
        await done.wait_for(2)
    finally:
        await agent.close()
    assert [type(m).__name__ for m in agent.messages()] == [
        "UserMessage",
        "AssistantMessage",
        "AgentMessage",
        "AssistantMessage",
    ]


async def test_internal_continuations_respect_the_budget(caplog: pytest.LogCaptureFixture) -> None:
    done = Completions()

    class Loop(Extension):
        """Every completed request asks for another one: an endless loop without the budget."""

        async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
            await context.publish(InternalMessageEvent(context.session_id, "again"))

    agent = Agent(FunctionModel(lambda request: "ok"), extensions=[Loop(), done])
    config = AgentRunConfig(max_internal_continuations=3)
    with caplog.at_level(logging.WARNING, logger="zett_agent.agent"):
        await agent.run("start", config=config)
        await agent.wait_idle()
    await agent.close()

    assert len(done.inputs) == 1 + 3  # the external run, then three continuations
    assert "max_internal_continuations=3" in caplog.text

    # an external run resets the budget
    agent = Agent(FunctionModel(lambda request: "ok"), extensions=[Loop(), done])
    await agent.run("again", config=config)
    await agent.wait_idle()
    await agent.close()
    assert len(done.inputs) == 8


async def test_steer_into_an_idle_session_starts_a_background_request() -> None:
    done = Completions()
    agent = Agent(ScriptedModel(["answered"]), extensions=[done])
    assert agent.steer("hello?") is False
    await done.wait_for(1)
    await agent.close()
    assert agent.messages() == (UserMessage("hello?"), AssistantMessage("answered"))


async def test_close_cancels_background_requests_and_is_idempotent() -> None:
    entered = asyncio.Event()
    events = EventLog()

    async def hang(request: ModelRequest) -> str:
        entered.set()
        await asyncio.Event().wait()
        return "never"

    agent = Agent(FunctionModel(hang), extensions=[events])
    await agent.publish(InternalMessageEvent("s", "work"))
    await entered.wait()
    await agent.close()
    await agent.close()

    assert events.types()[-1] == "RUN_CANCELLED"
    with pytest.raises(AgentClosedError):
        await agent.run("more")
    with pytest.raises(AgentClosedError):
        agent.steer("more")


async def test_memory_error_in_a_tool_fails_the_request_instead_of_becoming_a_tool_result() -> None:
    from zett_agent.agent import Agent
    from zett_agent.messages import AssistantMessage, ToolCall
    from zett_agent.testing import ScriptedModel
    from zett_agent.tools import AgentTool

    def allocate() -> str:
        raise MemoryError("cannot allocate")

    model = ScriptedModel(
        [AssistantMessage(tool_calls=(ToolCall("1", "allocate", {}),)), "unreachable"]
    )
    agent = Agent(
        model, tools=[AgentTool("allocate", "", {"type": "object", "properties": {}}, allocate)]
    )
    with pytest.raises(MemoryError):
        await agent.run("go")
    await agent.close()


# --- memory ------------------------------------------------------------------------------------


async def test_a_dropped_agent_and_its_run_contexts_are_freed_without_the_cycle_collector() -> None:
    """Nothing of a finished request points back at its agent in a cycle: dropping the agent
    frees it and every context at once, so a registry that holds agents weakly lets go of them
    at once too (with the collector off, a cycle would keep them until the next collection)."""
    import gc
    import weakref

    contexts: list[weakref.ref[AgentRunContext]] = []

    class Watch(Extension):
        async def on_tool(self, context: AgentRunContext) -> None:
            contexts.append(weakref.ref(context))

    model = ScriptedModel([call("echo", text="a"), call("echo", text="b"), "done", "summary"])
    agent = Agent(model, tools=[echo], extensions=[Watch()])
    assert (await agent.run("go")).content == "done"
    await agent.compact()
    await agent.close()
    assert contexts
    dropped = weakref.ref(agent)
    gc.collect()
    gc.disable()
    try:
        del agent, model
        assert dropped() is None, gc.get_referrers(dropped()) if dropped() else ""
        assert [ref for ref in contexts if ref() is not None] == []
    finally:
        gc.enable()


# --- continuing a request a dead process left ------------------------------------------------


async def test_a_continuation_runs_only_the_unanswered_calls_then_goes_on_without_new_input() -> (
    None
):
    from zett_agent._runtime._agent import continue_request

    ran: list[str] = []

    @tool
    def work(name: str) -> str:
        """Do one piece of work.

        Args:
            name: Which piece.
        """
        ran.append(name)
        return f"did {name}"

    asked = calls(
        tool_call("work", call_id="a", name="a"), tool_call("work", call_id="b", name="b")
    )
    model = ScriptedModel(["all done"])
    log: list[tuple[str, str]] = []
    agent = Agent(model, tools=[work], extensions=[Recorder(log)])
    config = AgentRunConfig(session_id="s", max_turns=2)
    # what a dead process left: the input, the model's calls, one of their results
    agent.session_store.load("s").messages[:] = [
        UserMessage("go"),
        asked,
        ToolMessage("a", "work", "did a"),
    ]
    result = await continue_request(agent, config, turns_done=1)

    assert result.content == "all done"
    assert ran == ["b"]  # the answered call did not run again
    assert [type(m).__name__ for m in agent.messages("s")] == [
        "UserMessage", "AssistantMessage", "ToolMessage", "ToolMessage", "AssistantMessage"
    ]  # fmt: skip
    # no input appended, so no on_message; that turn's after_turn, then the next turn's
    hooks = [name for name, _ in log]
    assert "Recorder.on_message" not in hooks
    assert hooks.count("Recorder.after_turn") == 2
    # max_turns counts the turns made before: with every call answered, a continuation after
    # max_turns turns makes no model call
    again = Agent(ScriptedModel(["never asked"]), tools=[work])
    again.session_store.load("t").messages[:] = [
        UserMessage("go"),
        asked,
        ToolMessage("a", "work", "did a"),
        ToolMessage("b", "work", "did b"),
    ]
    with pytest.raises(MaxTurnsExceeded):
        await continue_request(again, AgentRunConfig(session_id="t", max_turns=1), turns_done=1)
    assert ran == ["b"]


async def test_tool_context_names_the_call_and_gives_each_call_its_own_key() -> None:
    from zett_agent.tools import ToolContext, tool_context

    seen: list[ToolContext] = []

    @tool
    async def probe() -> str:
        """Look at the call."""
        seen.append(await asyncio.to_thread(tool_context))  # a thread copies the context
        return "ok"

    with pytest.raises(LookupError, match="outside a tool call"):
        tool_context()
    model = ScriptedModel(
        [calls(tool_call("probe", call_id="x"), tool_call("probe", call_id="y")), "done"]
    )
    await Agent(model, tools=[probe]).run("go", config=AgentRunConfig(session_id="k"))
    assert sorted(c.call.id for c in seen) == ["x", "y"]
    assert {c.session_id for c in seen} == {"k"}
    keys = {c.idempotency_key for c in seen}
    assert len(keys) == 2 and all(len(k) == 32 for k in keys)
