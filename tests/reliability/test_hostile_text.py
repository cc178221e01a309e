"""A child whose text is not valid Unicode (a lone surrogate such as ``"\\ud800"``).

Python holds such a string; UTF-8 cannot encode it, so a parent that took one into a message
would fail its next model request (the task reading ``completed`` all the same). Nothing a
child sends may do that: the engine refuses it on every decoding path (``ProtocolError`` for
that job only), the worker refuses to send it (naming where it is), a child agent replaces it
in its report and progress, and the extension never puts it into a message or a tool result,
whatever the runner. Every test that drives a parent checks its requests the way a model
adapter sends them: JSON encoded to UTF-8 strictly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import _text_children as bad
import pytest
from _text_children import LONE, StrictStepModel, strict_utf8

from support.calls import calls, start
from support.hostile_pool import GUARD, Sibling, first_event, outcome
from support.liveness import alive
from support.parent import parent_answer
from support.scripted_models import tool_results
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition, SubAgentExtension
from zett_agent.messages import AgentMessage, AssistantMessage, ToolMessage
from zett_agent.process import JobFailed, JobUsage, ProcessPool, ProtocolError
from zett_agent.process._wire import _strbuild
from zett_agent.runners import InProcessRunner
from zett_agent.tools import AgentTool

REPLACED = "\ufffd"
USAGE = b'"u":{"cpu":0,"maxrss":0}'
BEGIN_EVENT = b'{"k":"begin","m":"event"}'
BEGIN_RESULT = b'{"k":"begin","m":"result"}'
END_RESULT = b'{"k":"end",' + USAGE + b"}"


def is_valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ------------------------------------------------------------------ the engine


@contextlib.asynccontextmanager
async def pool_with_sibling(fifo: tuple[str, int], containment: str) -> AsyncIterator[ProcessPool]:
    async with ProcessPool(2, containment=containment) as pool:
        sibling = Sibling(pool, *fifo)
        await sibling.started()
        yield pool
        await sibling.completes()
        async with asyncio.timeout(GUARD):  # and the pool takes new work
            assert await pool.submit(len, "next") == 4


def text_frames(raw: bytes, length: int, width: int, *, kind: bytes = b"result") -> list[bytes]:
    """A streamed message whose value is a text of ``raw`` bytes, announced as ``length``
    characters of ``width`` bytes (an announcement that fits the bytes: only they are wrong)."""
    announce = b'{"k":"text","n":%d,"c":%d,"w":%d,"a":false}' % (len(raw), length, width)
    begin, end = (BEGIN_RESULT, END_RESULT) if kind == b"result" else (BEGIN_EVENT, b'{"k":"end"}')
    return [begin, announce, raw, end]


#: what a hostile child writes: a lone surrogate on every path the parent decodes
BAD_FRAMES: dict[str, list[bytes]] = {
    "event": [b'{"k":"event","v":"\\ud800"}'],
    "event, upper case": [b'{"k":"event","v":{"a":["ok","\\uDFFF"]}}'],
    "high without low": [b'{"k":"event","v":"\\ud83d x"}'],
    "high then escaped backslash": [b'{"k":"event","v":"\\ud83d\\\\ude00"}'],
    "dict key": [b'{"k":"event","v":{"\\udc00":1}}'],
    "result": [b'{"k":"result","v":{"report":"ok \\udbff"},' + USAGE + b"}"],
    "error type": [b'{"k":"error","type":"\\ud800","message":"m","traceback":"",' + USAGE + b"}"],
    "error message": [
        b'{"k":"error","type":"E","message":"m \\ud800","traceback":"",' + USAGE + b"}"
    ],
    "streamed val": [BEGIN_RESULT, b'{"k":"val","v":"\\ud800"}', END_RESULT],
    "streamed items": [
        BEGIN_RESULT,
        b'{"k":"open","t":"list"}',
        b'{"k":"items","v":["a","\\ude00"]}',
        b'{"k":"close"}',
        END_RESULT,
    ],
    "streamed fields": [
        BEGIN_EVENT,
        b'{"k":"open","t":"dict"}',
        b'{"k":"fields","v":{"a":"\\ud800"}}',
        b'{"k":"close"}',
        b'{"k":"end"}',
    ],
    "streamed key": [
        BEGIN_RESULT,
        b'{"k":"open","t":"dict"}',
        b'{"k":"key","v":"\\udfff"}',
        b'{"k":"val","v":1}',
        b'{"k":"close"}',
        END_RESULT,
    ],
    # the three bytes of U+D800 in a text frame (valid UTF-8 but for being a surrogate)
    "text frame": text_frames(b"ab\xed\xa0\x80", 3, 2),
    "text frame of an event": text_frames(b"\xed\xbf\xbf" * 10, 10, 2, kind=b"event"),
}


#: texts are put together in two ways (in place, or joined where the C API cannot be reached)
PATHS = [(case, True) for case in BAD_FRAMES] + [
    (case, False) for case in BAD_FRAMES if case.startswith("text")
]


@pytest.mark.parametrize(
    ("case", "builder"), PATHS, ids=[f"{c}-{'in place' if b else 'joined'}" for c, b in PATHS]
)
async def test_a_lone_surrogate_on_any_path_fails_that_job_only(
    case: str,
    builder: bool,
    fifo: tuple[str, int],
    containment: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the parent's two ways of putting a text together (in place, or joined where the C API
    # cannot be reached) refuse it alike
    monkeypatch.setattr(_strbuild, "available", builder and _strbuild.available)
    async with pool_with_sibling(fifo, containment) as pool:
        job = pool.submit(bad.write_frames, BAD_FRAMES[case])
        pid = await first_event(job)
        error = await outcome(job)
        assert isinstance(error, ProtocolError), error
        assert "lone surrogate" in str(error) and "not valid Unicode" in str(error), error
        assert not alive(pid)


async def test_escaped_surrogate_pairs_are_valid_text(
    fifo: tuple[str, int], containment: str
) -> None:
    async with pool_with_sibling(fifo, containment) as pool:
        job = pool.submit(bad.emoji_pair)
        async with asyncio.timeout(GUARD):
            events = [event async for event in job.events()]
            assert await job == "\U0001f600"
        assert events == ["\U0001f600 \U0001f600"]


async def test_the_worker_refuses_to_send_a_lone_surrogate_naming_where_it_is(
    fifo: tuple[str, int], containment: str
) -> None:
    async with pool_with_sibling(fifo, containment) as pool:
        async with asyncio.timeout(GUARD):
            said = await pool.submit(bad.emit_lone_surrogate)
        assert said.startswith("emit() takes JSON data"), said
        assert "at ['note'][1]: a str holding a lone surrogate ('\\ud800' at index 1)" in said

        # a result, in one frame and streamed (a long text): the job fails, naming the path
        for size in (10, 100_000):
            job = pool.submit(bad.return_lone_surrogate, size)
            error = await outcome(job)
            assert isinstance(error, JobFailed), error
            assert error.type_name == "TypeError"
            assert "results must be JSON data" in error.message
            assert f"at ['report']: a str holding a lone surrogate ('\\ud800' at index {size})" in (
                error.message
            )

        # an exception that holds one arrives as the job's failure, the surrogate escaped
        job = pool.submit(bad.raise_lone_surrogate)
        error = await outcome(job)
        assert isinstance(error, JobFailed), error
        assert error.message == "bad \\ud800 text"
        assert "bad \\ud800 text" in error.traceback_text


# ------------------------------------------------------------------ the subagent layer


def definitions(*, raw: bool) -> list[SubAgentDefinition]:
    found = [
        SubAgentDefinition(
            "bad", "answers with a lone surrogate", "p", model=bad.LoneSurrogateChild()
        ),
        SubAgentDefinition("broken", "raises one", "p", model=bad.BrokenChild()),
    ]
    if raw:
        found.append(
            SubAgentDefinition(
                "raw", "writes one", "p", model=bad.RawFrameChild(), tools=(bad.RAW_FRAME_TOOL,)
            )
        )
    return found


def runner_for(kind: str) -> dict[str, Any]:
    return {"runner": InProcessRunner()} if kind == "in-process" else {}


@pytest.mark.parametrize("kind", ["process", "in-process"])
async def test_a_child_with_a_lone_surrogate_never_fails_the_parents_request(kind: str) -> None:
    raw = kind == "process"  # only a process has a channel to write raw frames into
    kinds = ["bad", "broken", *(["raw"] if raw else [])]
    ids = [f"task-{i + 1}" for i in range(len(kinds))]
    model = StrictStepModel(
        [
            start(*kinds),
            # the report and the errors (tool results)
            calls(*(("task_output", {"task_id": i, "wait_seconds": GUARD}) for i in ids)),
            # the progress: last_tool in task_status and task_list
            calls(("task_status", {"task_id": ids[0]}), ("task_list", {})),
            AssistantMessage("went on"),
        ]
    )
    extension = AsyncSubAgentExtension(definitions(raw=raw), **runner_for(kind))
    async with extension, parent_answer(model, extension, within=GUARD) as answer:
        tasks = extension.tasks("parent")  # before the client closes: that releases them
    assert answer == "went on"  # every request of the parent was sent
    assert len(model.requests) == 4
    done, broken, *rest = tasks
    assert done.status is SubAgentTaskStatus.COMPLETED
    assert done.output == f"report {REPLACED} end"
    assert done.last_tool == f"look{REPLACED}"
    assert broken.status is SubAgentTaskStatus.FAILED and broken.error is not None
    assert "model broke" in broken.error and is_valid(broken.error)
    if raw:
        [raw_task] = rest
        assert raw_task.status is SubAgentTaskStatus.FAILED
        assert "invalid data" in (raw_task.error or "") and "lone surrogate" in (
            raw_task.error or ""
        )
    outputs = [json.loads(m.text) for m in tool_results(model.requests[2])[-len(kinds) :]]
    assert outputs[0]["content"] == f"report {REPLACED} end"
    assert "model broke" in outputs[1]["error"]
    status, listing = (json.loads(m.text) for m in tool_results(model.requests[3])[-2:])
    assert status["last_tool"] == f"look{REPLACED}"
    assert listing["tasks"][0]["last_tool"] == f"look{REPLACED}"


def settle_tool(extension: AsyncSubAgentExtension) -> AgentTool:
    """The parent's tool ``settle``: it returns once every task of the parent's session has
    settled (so their completion notices come with the model's next request)."""

    async def settle() -> str:
        for task in extension.tasks("parent"):
            await extension.wait(task, GUARD)
        return "all settled"

    return AgentTool("settle", "wait", {"type": "object", "properties": {}}, settle)


@pytest.mark.parametrize("kind", ["process", "in-process"])
async def test_completion_notices_of_such_children_reach_the_model(kind: str) -> None:
    # max_retained=0: each task is forgotten as it finishes, so its notice carries its report
    model = StrictStepModel(
        [start("bad", "broken"), calls(("settle", {})), AssistantMessage("noted")]
    )
    extension = AsyncSubAgentExtension(definitions(raw=False), max_retained=0, **runner_for(kind))
    async with (
        extension,
        parent_answer(model, extension, tools=(settle_tool(extension),), within=GUARD) as answer,
    ):
        assert answer == "noted"
    notices = [m.content for m in model.requests[-1].messages if isinstance(m, AgentMessage)]
    assert len(notices) == 2, notices
    assert any(f"report {REPLACED} end" in n for n in notices), notices
    assert any("model broke" in n for n in notices), notices


async def test_the_foreground_subagent_tool_result_is_valid_text() -> None:
    model = StrictStepModel(
        [
            calls(("subagent", {"subagent_type": "bad", "description": "d", "prompt": "go"})),
            calls(("subagent", {"subagent_type": "broken", "description": "d", "prompt": "go"})),
            AssistantMessage("went on"),
        ]
    )
    extension = SubAgentExtension(definitions(raw=False))
    async with extension, parent_answer(model, extension, within=GUARD) as answer:
        assert answer == "went on"
    report, failure = tool_results(model.requests[-1])
    assert report.text == f"report {REPLACED} end"
    assert failure.failed and "model broke" in failure.text and is_valid(failure.text)


# -- a runner that delivers child text as it is (as a cluster runner could) --------------------


class RawJob:
    """A finished child whose events, report and failure hold lone surrogates, as is."""

    def __init__(self, report: Any, error: BaseException | None) -> None:
        self.pid = None
        self._report, self._error = report, error

    async def events(self) -> AsyncIterator[Any]:
        yield {"kind": "turn_started", "turn": 1}
        yield {"kind": "turn_finished", "turn": 1, "tool_calls": ["tool" + LONE]}

    def done(self) -> bool:
        return True

    async def wait(self) -> None:
        return None

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._report

    def exception(self) -> BaseException | None:
        return self._error

    async def cancel(self) -> None:
        return None

    def usage(self) -> JobUsage:
        return JobUsage(0.0, 0, 0, 0.0)

    def info(self) -> Mapping[str, Any]:
        return {"node": "n" + LONE}


class RawRunner:
    """Hands out ``RawJob`` s: the report for ``bad``, a failure for ``broken``."""

    def warm_up(self, modules: Iterable[str] = ()) -> None:
        return None

    async def submit(self, spec: Any, *, limits: Any = None) -> RawJob:
        if spec.definition.name == "bad":
            return RawJob({"content": "raw " + LONE}, None)
        return RawJob(None, JobFailed("Boom" + LONE, "failed " + LONE))

    async def close(self) -> None:
        return None


class NodeNotices(AsyncSubAgentExtension):
    """Notices that name the node the runner reports (text the runner shaped)."""

    def completion_notice(self, task: Any) -> str | None:
        return f"{super().completion_notice(task)} It ran on {task.job.info()['node']}."


async def test_the_extension_cleans_what_any_runner_delivers() -> None:
    model = StrictStepModel(
        [
            start("bad", "broken"),
            calls(("settle", {})),  # the notices come with the next request
            calls(("task_status", {"task_id": "task-1"}), ("task_list", {})),
            calls(("task_output", {"task_id": "task-1"}), ("task_output", {"task_id": "task-2"})),
            AssistantMessage("went on"),
        ]
    )
    extension = NodeNotices(definitions(raw=False), runner=RawRunner())
    async with (
        extension,
        parent_answer(model, extension, tools=(settle_tool(extension),), within=GUARD) as answer,
    ):
        assert answer == "went on"
        done, broken = extension.tasks("parent")  # before the client closes: that releases them
    # the task records hold valid text too (an application serves them as JSON)
    assert done.output == f"raw {REPLACED}" and done.last_tool == f"tool{REPLACED}"
    assert broken.error == f"the child agent raised Boom{REPLACED}: failed {REPLACED}"
    notices = [m.content for m in model.requests[2].messages if isinstance(m, AgentMessage)]
    assert len(notices) == 2 and f"Boom{REPLACED}" in notices[1], notices
    assert all(n.endswith(f"It ran on n{REPLACED}.") for n in notices), notices
    results = [m for r in model.requests for m in tool_results(r)]
    assert all(is_valid(m.text) for m in results)
    infos = [json.loads(m.text) for m in results if m.name in ("task_status", "task_output")]
    assert {i.get("node") for i in infos} == {f"n{REPLACED}"}
    assert [i.get("content") for i in infos if i["task_id"] == "task-1"][-1] == f"raw {REPLACED}"


def test_the_strict_model_refuses_what_a_model_server_would() -> None:
    # the check the tests above rely on: a request holding a lone surrogate does not encode
    from zett_agent.model import ModelRequest

    with pytest.raises(UnicodeEncodeError):
        strict_utf8(ModelRequest((ToolMessage("c", "t", "x" + LONE),)))
    strict_utf8(ModelRequest((ToolMessage("c", "t", "x" + REPLACED),)))
