"""What the parent charges a brokered child for one model call: reported usage, else an estimate.

Every brokered call is charged exactly once, when it ends, however it ends (completed, closed or
cancelled by the child, the child dead, an error mid-stream, the broker closed): the usage its
model reported, when it reported any, else an estimate. Until then the call holds an estimate in
the child's count, so its budget sees the calls under way (see ``_broker``).

**The estimate.** About four characters per token (``CHARS_PER_TOKEN``), rounded up:

- input: the characters of the request the provider gets: the system prompt, every message's
  text (user and agent content, assistant content, tool results, tool call ids and names), the
  tools' names and descriptions, and the JSON values of tool call arguments and tool schemas,
  where a string counts its characters (an object's keys too) and any other value one;
- output: the characters of the text the model streamed (or, for a completed response without
  usage, of its content and tool calls: names and argument values, counted as above), and at
  least one token once it streamed anything.

A call that never reached the model (refused, or stopped by a budget before it was made) and
one the provider refused with an HTTP status before it streamed anything are charged nothing:
providers bill neither. The model protocol carries usage only in the completed event, so a call
that ends before it is charged the estimate, whatever the provider may have counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator
from typing import Any

from zett_agent._messages import AgentMessage, AssistantMessage, ToolMessage, UserMessage
from zett_agent._model import ModelRequest, Usage

__all__ = [
    "CHARS_PER_TOKEN",
    "CallCharge",
    "estimated_tokens",
    "request_chars",
    "request_chars_in_steps",
    "response_chars",
]

#: characters per token of the estimate (English text and JSON run at about 3.5 to 4.5)
CHARS_PER_TOKEN = 4
#: values walked between two yields of ``request_chars_in_steps``
_STEP = 4096


def estimated_tokens(chars: int) -> int:
    """``chars`` characters in tokens: ``ceil(chars / CHARS_PER_TOKEN)``."""
    return -(-chars // CHARS_PER_TOKEN)


def request_chars_in_steps(request: ModelRequest, step: int = _STEP) -> Generator[None, None, int]:
    """The characters of ``request`` that count for its input estimate, as a generator.

    It yields after every ``step`` messages, tools or JSON values (the parent walks a child's
    request a slice at a time, however large one tool call's arguments are), and returns the
    count.
    """
    total = len(request.system_prompt or "")
    values: list[Any] = []  # the JSON values (arguments, schemas), walked below
    for index, message in enumerate(request.messages):
        if isinstance(message, UserMessage):
            total += len(message.content)
        elif isinstance(message, AssistantMessage):
            total += len(message.content)
            for call in message.tool_calls:
                total += len(call.id) + len(call.name)
                values.append(call.arguments)
        elif isinstance(message, ToolMessage):
            total += len(message.call_id) + len(message.name) + len(message.text)
        elif isinstance(message, AgentMessage):
            total += len(message.content) + len(message.source)
        if index % step == step - 1:
            yield
    for tool in request.tools:
        total += len(tool.name) + len(tool.description)
        values.append(tool.parameters)
    counted = yield from _json_chars(values, step)
    return total + counted


def request_chars(request: ModelRequest) -> int:
    """``request_chars_in_steps`` at once."""
    return _drain(request_chars_in_steps(request))


def response_chars(message: AssistantMessage) -> int:
    """The characters of a response that count for its output estimate."""
    calls = message.tool_calls
    names = sum(len(call.name) for call in calls)
    return len(message.content) + names + _drain(_json_chars([c.arguments for c in calls]))


def _drain(steps: Generator[None, None, int]) -> int:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            counted: int = done.value
            return counted


def _json_chars(values: list[Any], step: int = _STEP) -> Generator[None, None, int]:
    """The characters of JSON ``values`` (strings and keys by length, other values one each).

    Yields after every ``step`` values; an object or list is walked through an iterator, so a
    single large one is walked across steps too.
    """
    total = 0
    seen = 0
    stack: list[Iterator[Any]] = [iter(values)]
    while stack:
        value = next(stack[-1], _END)
        if value is _END:
            stack.pop()
            continue
        seen += 1
        if seen % step == 0:
            yield
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            stack.append(itertools.chain.from_iterable(value.items()))
        elif isinstance(value, list | tuple):
            stack.append(iter(value))
        else:
            total += 1
    return total


_END = object()


class CallCharge:
    """One brokered call's share of its child's count, from its start to its end.

    ``input_tokens`` and ``output_tokens`` are what the call counts for now: nothing until it
    is made, then its estimate as it goes, and at its end ``final()``. The broker changes them
    (and its totals with them) in one place.
    """

    __slots__ = (
        "input_chars",
        "input_tokens",
        "output_chars",
        "output_tokens",
        "reached",
        "refused",
        "reported",
        "streamed",
    )

    def __init__(self) -> None:
        #: the characters of the request (its input estimate), once walked
        self.input_chars = 0
        #: the characters the model streamed (or its completed response holds)
        self.output_chars = 0
        #: it streamed something (text, or the completed response)
        self.streamed = False
        #: the model was asked (its ``stream`` was called)
        self.reached = False
        #: the provider refused it with an HTTP status before it streamed anything
        self.refused = False
        #: the usage the model reported (in its completed event)
        self.reported: Usage | None = None
        self.input_tokens = 0
        self.output_tokens = 0

    def estimate(self) -> tuple[int, int]:
        """``(input, output)`` tokens by the estimate (see the module's docstring)."""
        output = estimated_tokens(self.output_chars)
        return estimated_tokens(self.input_chars), max(output, 1) if self.streamed else output

    def final(self) -> tuple[int, int]:
        """What the call is charged: reported usage, else the estimate, else nothing."""
        if self.reported is not None:
            return max(0, int(self.reported.input_tokens)), max(0, int(self.reported.output_tokens))
        if not self.reached or self.refused:
            return 0, 0
        return self.estimate()
