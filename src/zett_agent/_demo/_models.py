"""The demo's offline models: a parent that drives the five task tools, scripted children."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage


def _reply(message: AssistantMessage, request: ModelRequest) -> ModelEvent:
    # Token counts are a rough stand-in (4 characters a token) so the view has numbers to show.
    size = sum(len(getattr(m, "content", "") or getattr(m, "text", "")) for m in request.messages)
    usage = Usage(input_tokens=size // 4 + 1, output_tokens=len(message.content) // 4 + 1)
    return ModelEvent.completed(ModelResponse(message, usage))


class DemoChildModel:
    """A child that reads its task (JSON in the prompt), calls the named tool once, reports."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            prompt = next(m.content for m in request.messages if m.role == "user")  # type: ignore[union-attr]
            task = json.loads(prompt)
            call = ToolCall("work-1", task["tool"], task.get("arguments", {}))
            yield _reply(AssistantMessage(tool_calls=(call,)), request)
            return
        outcome = results[-1]
        if outcome.failed:
            text = f"the tool failed: {outcome.text}"
        else:
            data = json.loads(outcome.text)
            if "tried" in data:
                text = (
                    f"reading {data['tried']} was denied: {data['error']}"
                    if data["denied"]
                    else f"read {data['tried']} ({data['bytes']} bytes): not confined here"
                )
            else:
                text = (
                    f"hashed {data['files']} files ({data['bytes']} bytes) x{data['rounds']} "
                    f"rounds, digest {data['digest']}"
                )
        yield _reply(AssistantMessage(content=text), request)


class DemoParentModel:
    """The parent: starts every child at once, keeps working, cancels the spinner, reads reports.

    It decides from the conversation alone (no hidden state), so it behaves the same whether it
    runs in the parent or is pickled.
    """

    retry = RetryOptions(max_retries=0)

    def __init__(self, starts: list[dict[str, Any]]) -> None:
        self.starts = starts

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield _reply(self._next(request), request)

    def _next(self, request: ModelRequest) -> AssistantMessage:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        by_name: dict[str, list[ToolMessage]] = {}
        for message in results:
            by_name.setdefault(message.name, []).append(message)

        def infos(name: str) -> list[dict[str, Any]]:
            # A failed call's text is an error message, not JSON: the demo reads what worked.
            return [json.loads(m.text) for m in by_name.get(name, []) if m.ok]

        started = infos("task_start")
        if not started:
            calls = [
                ToolCall(f"start-{i}", "task_start", args) for i, args in enumerate(self.starts)
            ]
            return AssistantMessage("Starting the background tasks.", tuple(calls))
        ids: dict[str, list[str]] = {info["subagent_type"]: [] for info in started}
        for info in started:
            ids[info["subagent_type"]].append(info["task_id"])
        spinner = ids.get("spinner", [None])[0]
        if "survey" not in by_name:
            return AssistantMessage(
                "While they run, I survey the folder myself.",
                (ToolCall("survey-1", "survey", {}), ToolCall("list-1", "task_list", {})),
            )
        if spinner and "task_cancel" not in by_name:
            statuses = infos("task_status")
            if statuses and statuses[-1].get("last_tool") == "spin_forever":
                return AssistantMessage(
                    "The spinner never finishes: cancel it.",
                    (ToolCall("cancel-1", "task_cancel", {"task_id": spinner}),),
                )
            if statuses and statuses[-1].get("status") not in ("pending", "running"):
                pass  # it ended on its own (a real model may do that): nothing to cancel
            else:
                n = len(by_name.get("task_status", []))
                calls = [ToolCall(f"status-{n}", "task_status", {"task_id": spinner})]
                if n:
                    calls.insert(0, ToolCall(f"pause-{n}", "pause", {"seconds": 0.2}))
                return AssistantMessage(tool_calls=tuple(calls))
        # Read every other report; ask again for those still running after a long wait.
        latest: dict[str, dict[str, Any]] = {}
        for info in infos("task_output"):
            latest[info["task_id"]] = info
        waiting = [
            task_id
            for kind, task_ids in ids.items()
            if kind != "spinner"
            for task_id in task_ids
            if latest.get(task_id, {}).get("status") not in ("completed", "failed", "cancelled")
        ]
        if waiting:
            round_ = len(by_name.get("task_output", []))
            readers = [
                ToolCall(f"output-{round_}-{i}", "task_output", {"task_id": t, "wait_seconds": 600})
                for i, t in enumerate(waiting)
            ]
            return AssistantMessage("Collecting the reports.", tuple(readers))
        lines = []
        for task_id, info in latest.items():
            detail = info.get("content") or info.get("error") or ""
            lines.append(f"- {task_id} ({info['subagent_type']}) {info['status']}: {detail}")
        return AssistantMessage("Reports:\n" + "\n".join(lines))
