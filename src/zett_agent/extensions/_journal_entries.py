"""A durable child's journal entries: its messages as the JSON it sends and the store keeps.

A durable child (``AsyncSubAgentExtension(durable=True)``) sends each message of its
conversation to its parent as it is appended, and the parent keeps each in its task store
as one step of the task's journal. An entry is one of:

- ``{"m": MESSAGE}``: one message; ``"input": true`` beside ``"m"`` marks the message that
  started a request (the prompt, a ``task_resume`` follow-up);
- ``{"snapshot": [MESSAGE, ...]}``: the whole conversation after the child replaced it
  (compacted its history): the entries before it are no longer needed, and the parent drops
  them.

A ``MESSAGE`` has the JSON form of the broker's wire: ``{"role": "user", "content": str}``,
``{"role": "assistant", "content": str, "tool_calls": [{"id": str, "name": str,
"arguments": {...}}]}``, ``{"role": "tool", "call_id": str, "name": str, "text": str,
"status": "ok" | "failed" | "skipped"}`` or ``{"role": "agent", "content": str, "source":
str}``.

The parent checks what a child sends as hostile data (``decode_entry``: exact keys, exact
types, each failure a ``BadEntry`` saying where), and keeps its text within the bounds below
(``entry_text``); the same checks read it back from the store (``read_entry``). ``history``
rebuilds the conversation a resumed child starts from.

Imported by every durable child (through ``_child_journal``): it imports only the runtime's
data classes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
    message_json,
)

__all__ = [
    "MAX_ENTRY_BYTES",
    "MAX_JOURNAL_BYTES",
    "MAX_NESTING",
    "MAX_STEPS",
    "BadEntry",
    "Conversation",
    "Entry",
    "decode_entry",
    "entry_text",
    "history",
    "message_entry",
    "read_entry",
    "snapshot_entry",
]

#: most steps (entries) one task's journal holds at once; a compaction starts it anew
MAX_STEPS = 10_000
#: most bytes (of stored JSON text) one task's journal holds at once
MAX_JOURNAL_BYTES = 64 << 20
#: largest entry, in bytes of its JSON text: a message, or a compacted conversation
MAX_ENTRY_BYTES = 8 << 20
#: deepest nesting of an entry's JSON (a tool call's arguments nest at most 4 levels less)
MAX_NESTING = 64


class BadEntry(ValueError):
    """A journal entry that is not one (the message says where and why)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One checked journal entry: its messages, and what kind of entry it is.

    ``snapshot``: the entry replaces every message before it (a compacted conversation).
    ``input``: its one message started a request.
    """

    messages: tuple[Message, ...]
    snapshot: bool = False
    input: bool = False


@dataclass(frozen=True, slots=True)
class Conversation:
    """What a journal rebuilds: the messages, and the turns the last request had made.

    Attributes:
        messages: The conversation, the results of each batch in the order of its calls.
        turns: Assistant messages since the last request's input (the request's turns).
    """

    messages: list[Message]
    turns: int


# -- the child's side ----------------------------------------------------------------------------


def message_entry(message: Message, *, input: bool = False) -> dict[str, Any]:
    """The entry of one message (``input``: it started a request)."""
    entry: dict[str, Any] = {"m": message_json(message)}
    if input:
        entry["input"] = True
    return entry


def snapshot_entry(messages: Iterable[Message]) -> dict[str, Any]:
    """The entry of a whole conversation, after the child replaced its messages."""
    return {"snapshot": [message_json(m) for m in messages]}


# -- the parent's side: checked both ways ----------------------------------------------------------


def decode_entry(data: object) -> Entry:
    """A child's entry checked key by key and type by type; ``BadEntry`` names the first fault."""
    if type(data) is not dict:
        raise BadEntry(f"an entry must be an object, {_got(data)}")
    if "snapshot" in data:
        if data.keys() != {"snapshot"}:
            raise BadEntry("a snapshot entry must have exactly the key snapshot")
        items = data["snapshot"]
        if type(items) is not list:
            raise BadEntry(f"snapshot must be a list, {_got(items)}")
        messages = tuple(_message(item, f"snapshot[{i}]") for i, item in enumerate(items))
        return Entry(messages, snapshot=True)
    keys = data.keys()
    if keys != {"m"} and keys != {"m", "input"}:
        raise BadEntry("an entry must have the key m (and input), or the key snapshot")
    flag = data.get("input", False)
    if flag is not True and flag is not False:
        raise BadEntry(f"input must be true or false, {_got(flag)}")
    return Entry((_message(data["m"], "m"),), input=flag)


def entry_text(data: Mapping[str, Any]) -> str:
    """The JSON text an entry is stored as, within the bounds.

    Raises:
        BadEntry: The text is larger than ``MAX_ENTRY_BYTES`` or nests deeper than
            ``MAX_NESTING`` (it would not be read back).
    """
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > MAX_ENTRY_BYTES:
        raise BadEntry(
            f"an entry of {size} bytes is larger than the {MAX_ENTRY_BYTES} a step holds"
        )
    _check_nesting(text)
    return text


def read_entry(text: str) -> Entry:
    """An entry's stored text, checked as ``decode_entry`` checks a child's (``BadEntry``)."""
    if len(text) > MAX_ENTRY_BYTES:
        raise BadEntry(f"it holds more than the {MAX_ENTRY_BYTES} bytes a step holds")
    _check_nesting(text)
    try:
        data = _DECODER.decode(text)
    except BadEntry:
        raise
    except (ValueError, RecursionError) as exc:
        raise BadEntry(f"the text is not valid JSON ({exc})") from None
    return decode_entry(data)


def history(entries: Iterable[Entry]) -> Conversation:
    """The conversation ``entries`` rebuild (a snapshot replaces what came before it).

    The results of each assistant message's calls follow it in the order of its calls (a
    child sends each when its tool returns, whatever the order).
    """
    messages: list[Message] = []
    turns = 0
    for entry in entries:
        if entry.snapshot:
            messages = list(entry.messages)
            turns = sum(isinstance(m, AssistantMessage) for m in messages)  # no input marked
            continue
        message = entry.messages[0]
        messages.append(message)
        if entry.input:
            turns = 0
        elif isinstance(message, AssistantMessage):
            turns += 1
    return Conversation(_in_call_order(messages), turns)


def _in_call_order(messages: list[Message]) -> list[Message]:
    ordered: list[Message] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        ordered.append(message)
        index += 1
        if not isinstance(message, AssistantMessage) or not message.tool_calls:
            continue
        end = index
        while end < len(messages) and isinstance(messages[end], ToolMessage):
            end += 1
        place = {call.id: n for n, call in enumerate(message.tool_calls)}
        results = messages[index:end]
        last = len(place)
        results.sort(
            key=lambda m: place.get(m.call_id, last) if isinstance(m, ToolMessage) else last
        )
        ordered.extend(results)
        index = end
    return ordered


_STATUSES = {status.value: status for status in ToolStatus}
_KEYS = {
    "user": frozenset({"role", "content"}),
    "assistant": frozenset({"role", "content", "tool_calls"}),
    "tool": frozenset({"role", "call_id", "name", "text", "status"}),
    "agent": frozenset({"role", "content", "source"}),
}
_CALL_KEYS = frozenset({"id", "name", "arguments"})


def _message(data: object, where: str) -> Message:
    if type(data) is not dict:
        raise BadEntry(f"{where} must be an object, {_got(data)}")
    role = data.get("role")
    keys = _KEYS.get(role) if type(role) is str else None
    if keys is None:
        raise BadEntry(f"{where}.role must be one of user, assistant, tool, agent")
    if data.keys() != keys:
        raise BadEntry(f"{where} must have exactly the keys {', '.join(sorted(keys))}")
    for name in sorted(keys - {"role", "tool_calls", "status"}):
        if type(data[name]) is not str:
            raise BadEntry(f"{where}.{name} must be a string, {_got(data[name])}")
    if role == "user":
        return UserMessage(data["content"])
    if role == "agent":
        return AgentMessage(data["content"], data["source"])
    if role == "tool":
        status = data["status"]
        found = _STATUSES.get(status) if type(status) is str else None
        if found is None:
            raise BadEntry(f"{where}.status must be one of ok, failed, skipped")
        return ToolMessage(data["call_id"], data["name"], data["text"], found)
    calls = data["tool_calls"]
    if type(calls) is not list:
        raise BadEntry(f"{where}.tool_calls must be a list, {_got(calls)}")
    decoded = []
    for number, call in enumerate(calls):
        place = f"{where}.tool_calls[{number}]"
        if type(call) is not dict or call.keys() != _CALL_KEYS:
            raise BadEntry(f"{place} must be an object with exactly the keys arguments, id, name")
        call_id, name, arguments = call["id"], call["name"], call["arguments"]
        if type(call_id) is not str or type(name) is not str:
            raise BadEntry(f"{place}.id and .name must be strings")
        if type(arguments) is not dict:
            raise BadEntry(f"{place}.arguments must be an object, {_got(arguments)}")
        decoded.append(ToolCall(call_id, name, arguments))
    return AssistantMessage(data["content"], tuple(decoded))


def _refuse(constant: str) -> Any:
    raise BadEntry(f"the JSON holds {constant}, which a journal never holds")


_DECODER = json.JSONDecoder(parse_constant=_refuse)
#: a JSON string, escapes included
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_DEPTH = {"[": 1, "{": 1, "]": -1, "}": -1}


def _check_nesting(text: str) -> None:
    """``BadEntry`` for JSON text nested deeper than ``MAX_NESTING`` (counted, not parsed)."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return
    brackets = _BRACKETS.findall(_STRING.sub("", text))
    if brackets and max(accumulate(map(_DEPTH.__getitem__, brackets))) > MAX_NESTING:
        raise BadEntry(f"the JSON is nested deeper than the {MAX_NESTING} levels a step holds")


def _got(value: object) -> str:
    return f"got {'null' if value is None else type(value).__name__}"
