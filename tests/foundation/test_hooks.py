"""One test (at least) per hook: each hook at its moment, with its power."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import cloudpickle
import pytest

from support.calls import call, calls, tool_call
from support.recorders import EventLog, Recorder, cancelled_once, echo
from zett_agent.agent import Agent, AgentRunConfig, AgentRunContext
from zett_agent.events import (
    RUN_COMPLETED,
    AgentEvent,
    EventType,
    MessageAppendedEvent,
    RunCompletedEvent,
)
from zett_agent.extensions import Extension, ModelCallNext, ToolCallNext
from zett_agent.messages import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.testing import FunctionModel, ScriptedModel
from zett_agent.tools import AgentTool, ToolResult, tool


def tool_messages(agent: Agent, session_id: str = "default") -> list[ToolMessage]:
    return [m for m in agent.messages(session_id) if isinstance(m, ToolMessage)]


async def test_full_order_of_hooks_for_a_tool_turn_and_a_final_turn() -> None:
    log: list[tuple[str, str]] = []
    model = ScriptedModel([call("echo", text="hi"), "done"])
    agent = Agent(model, extensions=[Recorder(log, "A"), Recorder(log, "B")], tools=[echo])

    result = await agent.run("go")

    assert result.content == "done"
    hooks = [h for h, _ in log]
    expected_a_then_b = [
        "on_tool", "on_state", "on_message", "before_run",
        "before_turn", "before_model", "after_model", "before_tool", "after_tool", "after_turn",
        "before_turn", "before_model", "after_model", "after_turn",
        "after_run", "on_success",
    ]  # fmt: skip
    assert hooks == [f"{x}.{h}" for h in expected_a_then_b for x in ("A", "B")]
    details = dict(log)
    assert details["A.on_message"] == "0"  # the input is not appended yet
    assert details["A.before_run"] == "1"  # ... and it is by before_run


# --- on_tool / on_state -----------------------------------------------------------------------


class Registers(Extension):
    def __init__(self, *tools: AgentTool) -> None:
        self.tools = tools

    async def on_tool(self, context: AgentRunContext) -> None:
        for t in self.tools:
            context.register_tool(t)


async def test_on_tool_registers_tools_that_reach_the_model_and_run() -> None:
    model = ScriptedModel([call("echo", text="ping"), "ok"])
    agent = Agent(model, extensions=[Registers(echo)])

    await agent.run("go")

    assert [spec.name for spec in model.requests[0].tools] == ["echo"]
    assert tool_messages(agent)[0].text == "ping"


async def test_duplicate_tool_names_raise_naming_both_owners() -> None:
    errors: list[BaseException] = []

    class Errors(Extension):
        async def on_error(self, context: AgentRunContext, error: BaseException) -> None:
            errors.append(error)

    agent = Agent(ScriptedModel(["x"]), extensions=[Errors(), Registers(echo)], tools=[echo])

    with pytest.raises(ValueError, match=r"'Registers'.*agent's tools"):
        await agent.run("go")
    assert len(errors) == 1


async def test_on_state_restores_per_session_state_after_on_tool() -> None:
    order: list[str] = []

    class Counter(Extension):
        async def on_tool(self, context: AgentRunContext) -> None:
            order.append("on_tool")

        async def on_state(self, context: AgentRunContext) -> None:
            order.append("on_state")
            state = context.session_state(self.name)
            state["runs"] = state.get("runs", 0) + 1
            context.system_prompt = f"run number {state['runs']}"

    model = ScriptedModel(["a", "b", "c"])
    agent = Agent(model, extensions=[Counter()])
    await agent.run("1")
    await agent.run("2")
    await agent.run("3", config=AgentRunConfig(session_id="other"))

    assert [r.system_prompt for r in model.requests] == [
        "run number 1",
        "run number 2",
        "run number 1",
    ]
    assert order == ["on_tool", "on_state"] * 3


# --- on_message / before_run ------------------------------------------------------------------


async def test_on_message_replaces_the_input_which_is_appended_once_and_published() -> None:
    seen_in_before_run: list[Any] = []

    class Mode(Extension):
        async def on_message(self, context: AgentRunContext) -> None:
            assert isinstance(context.input_message, UserMessage)
            context.input_message = UserMessage(f"[plan mode] {context.input_message.content}")

        async def before_run(self, context: AgentRunContext) -> None:
            seen_in_before_run.append(context.messages)

    events = EventLog()
    model = ScriptedModel(["ok"])
    agent = Agent(model, extensions=[Mode(), events])

    await agent.run("write code")

    assert model.requests[0].messages == (UserMessage("[plan mode] write code"),)
    assert seen_in_before_run == [(UserMessage("[plan mode] write code"),)]
    appended = [e for e in events.events if isinstance(e, MessageAppendedEvent)]
    assert appended[0].message == UserMessage("[plan mode] write code")
    # before_run runs after the input was published
    assert events.types()[:2] == ["RUN_STARTED", "MESSAGE_APPENDED"]


# --- before_turn / before_model ---------------------------------------------------------------


async def test_before_turn_edits_reach_the_provider_request() -> None:
    class Edit(Extension):
        async def before_turn(self, context: AgentRunContext) -> None:
            context.system_prompt = f"turn {context.turn}"
            context.add_message(AgentMessage(f"note for turn {context.turn}", source="edit"))
            if context.turn == 2:
                context.register_tool(echo)

    model = ScriptedModel([call("missing"), "done"])
    agent = Agent(model, extensions=[Edit()], system_prompt="base")

    await agent.run("go")

    first, second = model.requests
    assert first.system_prompt == "turn 1" and second.system_prompt == "turn 2"
    assert first.messages[-1] == AgentMessage("note for turn 1", source="edit")
    assert second.messages[-1] == AgentMessage("note for turn 2", source="edit")
    assert [t.name for t in first.tools] == [] and [t.name for t in second.tools] == ["echo"]


async def test_before_model_sees_the_request_and_its_additions_reach_the_same_call() -> None:
    seen: list[ModelRequest] = []

    class Notice(Extension):
        async def before_model(self, context: AgentRunContext, request: ModelRequest) -> None:
            seen.append(request)
            context.add_message(AgentMessage("task 1 finished", source="tasks"))

    model = ScriptedModel(["ok"])
    agent = Agent(model, extensions=[Notice()], system_prompt="sys")

    await agent.run("go")

    assert seen[0].messages == (UserMessage("go"),) and seen[0].system_prompt == "sys"
    assert model.requests[0].messages == (
        UserMessage("go"),
        AgentMessage("task 1 finished", source="tasks"),
    )


# --- on_model_request -------------------------------------------------------------------------


async def test_on_model_request_wraps_in_registration_order_and_can_replace_the_request() -> None:
    order: list[str] = []

    class Wrap(Extension):
        def __init__(self, name: str) -> None:
            self.name = name

        async def on_model_request(
            self, context: AgentRunContext, request: ModelRequest, call_next: ModelCallNext
        ) -> AsyncIterator[ModelEvent]:
            order.append(f"{self.name} enter")
            request = dataclasses.replace(
                request, system_prompt=f"{request.system_prompt}+{self.name}"
            )
            async for event in call_next(request):
                if event.response is not None:
                    message = event.response.message
                    event = ModelEvent.completed(
                        ModelResponse(AssistantMessage(f"{message.content}<{self.name}"))
                    )
                yield event
            order.append(f"{self.name} exit")

    model = ScriptedModel(["answer"])
    agent = Agent(model, extensions=[Wrap("outer"), Wrap("inner")], system_prompt="p")

    result = await agent.run("go")

    assert model.requests[0].system_prompt == "p+outer+inner"
    assert result.content == "answer<inner<outer"
    assert order == ["outer enter", "inner enter", "inner exit", "outer exit"]


async def test_default_on_model_request_closes_the_provider_stream_on_cancel() -> None:
    started = asyncio.Event()
    closed = asyncio.Event()

    class HangingModel:
        retry = RetryOptions(max_retries=0)

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            try:
                yield ModelEvent.text_delta("partial")
                started.set()
                await asyncio.Event().wait()
                yield ModelEvent.completed(ModelResponse(AssistantMessage("never")))
            finally:
                closed.set()

    class Passthrough(Extension):
        pass

    class Subclassed(Extension):
        async def on_model_request(
            self, context: AgentRunContext, request: ModelRequest, call_next: ModelCallNext
        ) -> AsyncIterator[ModelEvent]:
            async for event in super().on_model_request(context, request, call_next):
                yield event

    events = EventLog()
    agent = Agent(HangingModel(), extensions=[Passthrough(), Subclassed(), events])
    await cancelled_once(agent, started)

    assert closed.is_set()
    assert events.types()[-1] == "RUN_CANCELLED"
    assert "MODEL_TEXT_DELTA" in events.types()


# --- after_model ------------------------------------------------------------------------------


async def test_after_model_runs_after_the_assistant_message_is_appended() -> None:
    seen: list[tuple[Any, ...]] = []

    class After(Extension):
        async def after_model(self, context: AgentRunContext, response: ModelResponse) -> None:
            seen.append((context.messages[-1], response.message, response.usage))

    usage = Usage(3, 4)
    model = ScriptedModel([ModelResponse(AssistantMessage("hi"), usage)])
    agent = Agent(model, extensions=[After()])

    await agent.run("go")

    assert seen == [(AssistantMessage("hi"), AssistantMessage("hi"), usage)]


# --- before_tool / on_tool_call / after_tool --------------------------------------------------


async def test_before_tool_runs_before_each_invocation_even_for_unknown_tools() -> None:
    log: list[str] = []

    @tool
    def work() -> str:
        """Do work."""
        log.append("handler")
        return "worked"

    class Before(Extension):
        async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
            log.append(f"before {call.name}")

    model = ScriptedModel(
        [calls(tool_call("work", call_id="1"), tool_call("nope", call_id="2")), "done"]
    )
    agent = Agent(model, extensions=[Before()], tools=[work])

    await agent.run("go")

    assert log.index("before work") < log.index("handler")
    assert "before nope" in log
    unknown = tool_messages(agent)[1]
    assert unknown.status is ToolStatus.FAILED
    assert "Unknown tool 'nope'" in unknown.text and "work" in unknown.text


async def test_on_tool_call_can_change_arguments() -> None:
    class Shout(Extension):
        async def on_tool_call(
            self, context: AgentRunContext, call: ToolCall, call_next: ToolCallNext
        ) -> ToolResult:
            changed = dataclasses.replace(call, arguments={"text": call.arguments["text"].upper()})
            return await call_next(changed)

    agent = Agent(
        ScriptedModel([call("echo", text="hi"), "done"]), extensions=[Shout()], tools=[echo]
    )
    await agent.run("go")
    assert tool_messages(agent)[0].text == "HI"


async def test_on_tool_call_can_short_circuit_without_running_the_handler() -> None:
    ran: list[str] = []

    @tool
    def dangerous() -> str:
        """Delete everything."""
        ran.append("ran")
        return "deleted"

    class Deny(Extension):
        async def on_tool_call(
            self, context: AgentRunContext, call: ToolCall, call_next: ToolCallNext
        ) -> ToolResult:
            return ToolResult.error("denied by policy")

    agent = Agent(
        ScriptedModel([call("dangerous"), "done"]), extensions=[Deny()], tools=[dangerous]
    )
    await agent.run("go")

    assert ran == []
    [message] = tool_messages(agent)
    assert message.status is ToolStatus.FAILED and message.text == "denied by policy"


async def test_on_tool_call_raising_becomes_a_normal_tool_failure() -> None:
    errors: list[BaseException | None] = []

    class Boom(Extension):
        async def on_tool_call(
            self, context: AgentRunContext, call: ToolCall, call_next: ToolCallNext
        ) -> ToolResult:
            raise PermissionError("not allowed here")

        async def after_tool(
            self, context: AgentRunContext, call: ToolCall, result: ToolResult, error: Any
        ) -> None:
            errors.append(error)

    agent = Agent(
        ScriptedModel([call("echo", text="x"), "done"]), extensions=[Boom()], tools=[echo]
    )
    result = await agent.run("go")

    assert result.content == "done"
    [message] = tool_messages(agent)
    assert message.status is ToolStatus.FAILED
    assert message.text == "echo failed: PermissionError: not allowed here"
    assert isinstance(errors[0], PermissionError)


async def test_on_tool_call_transforms_results_in_nested_order() -> None:
    class Tag(Extension):
        def __init__(self, tag: str) -> None:
            self.name = tag

        async def on_tool_call(
            self, context: AgentRunContext, call: ToolCall, call_next: ToolCallNext
        ) -> ToolResult:
            result = await call_next(call)
            return ToolResult(f"{result.text}<{self.name}")

    agent = Agent(
        ScriptedModel([call("echo", text="x"), "done"]),
        extensions=[Tag("outer"), Tag("inner")],
        tools=[echo],
    )
    await agent.run("go")
    assert tool_messages(agent)[0].text == "x<inner<outer"


async def test_after_tool_rewrites_results_and_sees_the_original_error() -> None:
    seen: list[tuple[str, Any]] = []

    @tool
    def flaky() -> str:
        """Fail."""
        raise OSError("disk on fire")

    class Rewrite(Extension):
        async def after_tool(
            self, context: AgentRunContext, call: ToolCall, result: ToolResult, error: Any
        ) -> ToolResult | None:
            seen.append((result.text, error))
            if call.name == "echo":
                return ToolResult({"echoed": result.content})
            return ToolResult("recovered: " + str(error))

    class Second(Extension):
        async def after_tool(
            self, context: AgentRunContext, call: ToolCall, result: ToolResult, error: Any
        ) -> None:
            seen.append(("second saw", result.content))

    model = ScriptedModel(
        [
            calls(tool_call("echo", {"text": "a"}, call_id="1"), tool_call("flaky", call_id="2")),
            "done",
        ]
    )
    agent = Agent(model, extensions=[Rewrite(), Second()], tools=[echo, flaky])
    await agent.run("go")

    ok, failed = tool_messages(agent)
    assert ok.text == '{"echoed": "a"}' and ok.status is ToolStatus.OK
    assert failed.text == "recovered: disk on fire" and failed.status is ToolStatus.OK
    assert seen[0] == ("a", None)
    assert ("second saw", {"echoed": "a"}) in seen
    flaky_error = next(err for text, err in seen if text.startswith("flaky failed"))
    assert isinstance(flaky_error, OSError)
    # the next model request carries the rewritten results
    assert model.requests[1].messages[-2:] == (ok, failed)


async def test_after_tool_edits_of_the_result_reach_context_persistence_and_next_request() -> None:
    """Changes made to the result are included in context, persistence and the next model
    request: in-place edits, no return value."""
    persisted: list[ToolMessage] = []
    shared = ToolResult("secret: hunter2")

    @tool
    def leaky() -> ToolResult:
        """Return the same result object every time."""
        return shared

    class Redact(Extension):
        async def after_tool(
            self, context: AgentRunContext, call: ToolCall, result: ToolResult, error: Any
        ) -> None:
            result.content = result.content.replace("hunter2", "[redacted]")
            result.is_error = True

        async def on_event(self, context: AgentRunContext, event: Any) -> None:
            if isinstance(event, MessageAppendedEvent) and isinstance(event.message, ToolMessage):
                persisted.append(event.message)

    model = ScriptedModel([call("leaky"), call("leaky"), "done"])
    agent = Agent(model, extensions=[Redact()], tools=[leaky])
    await agent.run("go")

    first, second = tool_messages(agent)  # what the session store kept
    for message in (first, second):
        assert message.text == "secret: [redacted]" and message.status is ToolStatus.FAILED
    assert persisted == [first, second]  # what persistence subscribers received
    assert model.requests[1].messages[-1] == first  # what the next model request carried
    assert model.requests[2].messages[-1] == second
    # each call's hook edited its own copy: the handler's shared object is unchanged
    assert (shared.content, shared.is_error) == ("secret: hunter2", False)


async def test_after_tool_raising_fails_the_request_and_the_result_is_not_appended() -> None:
    class Strict(Extension):
        async def after_tool(
            self, context: AgentRunContext, call: ToolCall, result: ToolResult, error: Any
        ) -> None:
            raise RuntimeError("audit failed")

    agent = Agent(
        ScriptedModel([call("echo", text="a"), "done"]), extensions=[Strict()], tools=[echo]
    )
    with pytest.raises(RuntimeError, match="audit failed"):
        await agent.run("go")
    # the result is not appended; the call is answered as skipped so the session stays usable
    [placeholder] = tool_messages(agent)
    assert placeholder.status is ToolStatus.SKIPPED and "failed" in placeholder.text


# --- after_turn (steering) --------------------------------------------------------------------


async def test_after_turn_sees_completed_failed_and_steering_skipped_calls() -> None:
    fast_done = asyncio.Event()
    slow_started = asyncio.Event()
    slow_cancelled = asyncio.Event()
    after_turn_views: list[tuple[Any, ...]] = []

    @tool
    async def fast() -> str:
        """Finish at once."""
        fast_done.set()
        return "fast result"

    @tool
    def broken() -> str:
        """Fail."""
        raise ValueError("nope")

    @tool
    async def slow() -> str:
        """Never finish."""
        slow_started.set()
        try:
            await asyncio.Event().wait()
        finally:
            slow_cancelled.set()
        return "unreachable"

    class Observe(Extension):
        async def after_turn(self, context: AgentRunContext, result: AssistantMessage) -> None:
            after_turn_views.append((context.turn, result, context.messages))

    model = ScriptedModel(
        [
            calls(
                tool_call("fast", call_id="1"),
                tool_call("broken", call_id="2"),
                tool_call("slow", call_id="3"),
            ),
            "steered answer",
        ]
    )
    agent = Agent(model, extensions=[Observe()], tools=[fast, broken, slow])
    run = asyncio.create_task(agent.run("go"))
    await asyncio.gather(fast_done.wait(), slow_started.wait())
    assert agent.steer("stop, do something else") is True
    result = await run

    assert result.content == "steered answer"
    assert slow_cancelled.is_set()
    turn, opener, messages = after_turn_views[0]
    assert turn == 1 and opener.tool_calls[0].name == "fast"
    tool_results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [(m.call_id, m.status) for m in tool_results] == [
        ("1", ToolStatus.OK),
        ("2", ToolStatus.FAILED),
        ("3", ToolStatus.SKIPPED),
    ]
    assert tool_results[2].text == "skipped: interrupted by a steering message"
    assert messages[-1] == UserMessage("stop, do something else")
    # the steering turn follows as the next turn and sees the message
    assert model.requests[1].messages[-1] == UserMessage("stop, do something else")
    assert [v[0] for v in after_turn_views] == [1, 2]


async def test_steering_during_the_model_call_skips_calls_not_yet_started() -> None:
    in_model = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    @tool
    def work() -> str:
        """Work."""
        ran.append("work")
        return "w"

    async def answer(request: ModelRequest) -> AssistantMessage | str:
        if len(request.messages) == 1:
            in_model.set()
            await release.wait()
            return call("work")
        return "final"

    agent = Agent(FunctionModel(answer), tools=[work])
    run = asyncio.create_task(agent.run("go"))
    await in_model.wait()
    assert agent.steer("change of plan") is True
    release.set()
    assert (await run).content == "final"

    assert ran == []
    [skipped] = tool_messages(agent)
    assert skipped.status is ToolStatus.SKIPPED


async def test_no_after_turn_for_a_turn_that_never_completed() -> None:
    log: list[tuple[str, str]] = []
    agent = Agent(ScriptedModel([call("echo", text="a"), RuntimeError("model down")]),
                  extensions=[Recorder(log)], tools=[echo])  # fmt: skip
    with pytest.raises(RuntimeError):
        await agent.run("go")
    hooks = [h for h, _ in log]
    assert hooks.count("Recorder.after_turn") == 1  # only the first, completed turn
    assert hooks[-1] == "Recorder.on_error"


# --- after_run / on_success / on_error --------------------------------------------------------


async def test_after_run_runs_after_the_final_answer_is_appended() -> None:
    seen: list[Any] = []

    class After(Extension):
        async def after_run(self, context: AgentRunContext, result: AssistantMessage) -> None:
            seen.append((context.messages[-1], result))

    agent = Agent(ScriptedModel(["final"]), extensions=[After()])
    await agent.run("go")
    assert seen == [(AssistantMessage("final"), AssistantMessage("final"))]


async def test_on_success_runs_once_before_run_completed() -> None:
    order: list[str] = []

    class Success(Extension):
        async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
            order.append(f"success {result.content}")

        async def on_event(self, context: AgentRunContext, event: AgentEvent) -> None:
            if event.type is RUN_COMPLETED:
                order.append("completed")

    agent = Agent(
        ScriptedModel([call("echo", text="a"), "ok"]), extensions=[Success()], tools=[echo]
    )
    await agent.run("go")
    assert order == ["success ok", "completed"]


async def test_on_success_failing_prevents_run_completed_and_goes_through_on_error() -> None:
    log: list[tuple[str, str]] = []
    events = EventLog()

    class Fails(Extension):
        async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
            raise OSError("could not save")

    agent = Agent(ScriptedModel(["ok"]), extensions=[Fails(), Recorder(log), events])
    with pytest.raises(OSError, match="could not save"):
        await agent.run("go")

    assert ("Recorder.on_error", "OSError") in log
    assert "RUN_COMPLETED" not in events.types()
    assert events.types()[-1] == "RUN_FAILED"


async def test_on_error_runs_before_the_error_reaches_the_caller_and_cannot_mask_it() -> None:
    order: list[str] = []

    class Broken(Extension):
        async def on_error(self, context: AgentRunContext, error: BaseException) -> None:
            order.append("broken on_error")
            raise RuntimeError("secondary")

    class Observer(Extension):
        async def on_error(self, context: AgentRunContext, error: BaseException) -> None:
            order.append(f"observer saw {error}")

    agent = Agent(ScriptedModel([ValueError("primary")]), extensions=[Broken(), Observer()])
    with pytest.raises(ValueError, match="primary"):
        await agent.run("go")
    order.append("caller")
    assert order == ["broken on_error", "observer saw primary", "caller"]


# --- on_event ---------------------------------------------------------------------------------


async def test_on_event_sees_every_published_event_in_order() -> None:
    events = EventLog()
    model = ScriptedModel([ModelResponse(call("echo", text="a"), Usage(1, 2)), "done"])
    agent = Agent(model, extensions=[events], tools=[echo])
    await agent.run("go", config=AgentRunConfig(session_id="s1"))

    assert events.types() == [
        "RUN_STARTED",
        "MESSAGE_APPENDED",  # the input
        "TURN_STARTED",
        "MESSAGE_APPENDED",  # the tool-calling assistant message
        "TOOL_CALLED",
        "TOOL_FINISHED",
        "MESSAGE_APPENDED",  # the tool result
        "TURN_FINISHED",
        "TURN_STARTED",
        "MODEL_TEXT_DELTA",
        "MESSAGE_APPENDED",  # the final answer
        "TURN_FINISHED",
        "RUN_COMPLETED",
    ]
    assert {e.session_id for e in events.events} == {"s1"}
    finished = [e for e in events.events if e.type is EventType.TURN_FINISHED]
    assert [getattr(e, "usage", None) for e in finished] == [Usage(1, 2), None]
    completed = events.events[-1]
    assert isinstance(completed, RunCompletedEvent) and completed.result.content == "done"


async def test_on_event_sees_events_published_by_extensions_and_by_the_caller() -> None:
    events = EventLog()

    class Publisher(Extension):
        async def before_run(self, context: AgentRunContext) -> None:
            await context.publish(MessageAppendedEvent(context.session_id, AgentMessage("custom")))

    agent = Agent(ScriptedModel(["ok"]), extensions=[Publisher(), events])
    await agent.run("go")
    await agent.publish(MessageAppendedEvent("default", AgentMessage("from outside")))

    contents = [e.message.content for e in events.events if isinstance(e, MessageAppendedEvent)]
    assert "custom" in contents and contents[-1] == "from outside"


# --- on_compact -------------------------------------------------------------------------------


async def test_compact_restores_through_on_tool_and_on_state_and_makes_no_model_call() -> None:
    log: list[tuple[str, str]] = []

    class Summarize(Extension):
        async def on_compact(self, context: AgentRunContext) -> None:
            assert context.input_message is None
            context.replace_messages([AgentMessage(f"summary of {len(context.messages)} messages")])

    model = ScriptedModel(["first answer"])
    agent = Agent(model, extensions=[Recorder(log), Summarize()])
    await agent.run("hello")
    log.clear()

    await agent.compact()

    assert [h for h, _ in log] == ["Recorder.on_tool", "Recorder.on_state", "Recorder.on_compact"]
    assert len(model.requests) == 1
    assert agent.messages() == (AgentMessage("summary of 2 messages"),)


# --- accept -----------------------------------------------------------------------------------


async def test_accept_broadcasts_to_every_extension_and_names_acceptors() -> None:
    asked: list[str] = []

    class Answer(Extension):
        def __init__(self, name: str, answer: bool) -> None:
            self.name = name
            self.answer = answer

        def accept(self, config: AgentRunConfig | None, event: Any) -> bool:
            asked.append(f"{self.name} {config.session_id if config else None} {event}")
            return self.answer

    agent = Agent(
        ScriptedModel([]), extensions=[Answer("a", True), Answer("b", False), Answer("c", True)]
    )
    assert agent.accept({"approve": 1}, config=AgentRunConfig(session_id="s")) == ("a", "c")
    assert agent.accept("x") == ("a", "c")
    assert asked[:3] == ["a s {'approve': 1}", "b s {'approve': 1}", "c s {'approve': 1}"]
    assert asked[3] == "a None x"


# --- name / pending ---------------------------------------------------------------------------


async def test_name_defaults_to_the_class_and_duplicates_are_rejected() -> None:
    class Mine(Extension):
        pass

    class Named(Extension):
        name = "custom"

    assert Mine().name == "Mine" and Named().name == "custom"
    second = Mine()
    second.name = "Mine-2"
    Agent(ScriptedModel([]), extensions=[Mine(), second, Named()])
    with pytest.raises(ValueError, match="'Mine'"):
        Agent(ScriptedModel([]), extensions=[Mine(), Mine()])


async def test_pending_stays_true_for_a_shared_instance_until_every_request_ends() -> None:
    gates = {"one": asyncio.Event(), "two": asyncio.Event()}
    entered = {"one": asyncio.Event(), "two": asyncio.Event()}

    class Idle(Extension):
        """Has no hooks at all, yet takes part in the requests."""

    shared = Idle()

    def model_for(key: str) -> FunctionModel:
        async def answer(request: ModelRequest) -> str:
            entered[key].set()
            await gates[key].wait()
            return key

        return FunctionModel(answer)

    agent_one = Agent(model_for("one"), extensions=[shared])
    agent_two = Agent(model_for("two"), extensions=[shared])
    assert not shared.pending
    run_one = asyncio.create_task(agent_one.run("x"))
    run_two = asyncio.create_task(agent_two.run("y"))
    await asyncio.gather(entered["one"].wait(), entered["two"].wait())
    assert shared.pending
    # the count stays with this process: a copy shipped to a child is not pending
    assert not cloudpickle.loads(cloudpickle.dumps(shared)).pending

    gates["one"].set()
    assert (await run_one).content == "one"
    assert shared.pending  # agent_two's request is still running

    gates["two"].set()
    await run_two
    assert not shared.pending


async def test_pending_is_cleared_after_failed_and_cancelled_requests() -> None:
    shared = Extension()
    agent = Agent(ScriptedModel([RuntimeError("x")]), extensions=[shared])
    with pytest.raises(RuntimeError):
        await agent.run("go")
    assert not shared.pending

    entered = asyncio.Event()

    async def hang(request: ModelRequest) -> str:
        entered.set()
        await asyncio.Event().wait()
        return "never"

    agent = Agent(FunctionModel(hang), extensions=[shared])
    run = asyncio.create_task(agent.run("go"))
    await entered.wait()
    assert shared.pending
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not shared.pending
