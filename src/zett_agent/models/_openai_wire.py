r"""The wire format of OpenAI-compatible Chat Completions: request bodies, SSE, streamed deltas.

Pure functions and small state machines with no I/O, so the HTTP layer in ``openai.py`` stays thin
and every piece of the protocol can be tested without a server.

Text crosses this module only as valid Unicode a UTF-8 encoder takes: a lone surrogate in a
request (``"\\ud800"`` in a message, a tool result, a system prompt, a tool description) is sent
as U+FFFD (``encode_body``), and so is a lone ``\\ud800`` escape in what a server sends
(``parse_json``), so nothing downstream fails to encode an answer.

What the server sends is parsed with ``parse_json``, whose cost is bounded by the length of the
text: a document may not nest deeper than the ``json`` module's recursion limit, and one larger
than ``_CHECKED_CHARS`` may hold at most ``MAX_JSON_ITEMS`` commas and colons outside its
strings (each item of ``[[],[],...]`` costs the parser 100 to 250 ns and about 70 bytes, thirty
times or more what a character of a string costs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from zett_agent._model import (
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolSpec,
    TransientModelError,
    Usage,
)

_SNIPPET = 300

#: commas and colons outside the strings of one JSON document a server sends, at most (when it
#: is larger than ``_CHECKED_CHARS``): one per value or key the parser creates an object for, give
#: or take the first of each container, each costing it 100 to 250 ns and about 70 bytes where a
#: character of a string costs it 3 ns. So a document of ``[[],[],...]`` or ``[1.5,1.5,...]``
#: costs at most 15 to 40 ms, about what the largest document of text costs anyway; a chunk of
#: an answer holds a few dozen.
MAX_JSON_ITEMS = 2**17
_CHECKED_CHARS = 2**16
#: tool calls in one answer, and characters in one tool name, at most
MAX_TOOL_CALLS = 1024
MAX_TOOL_NAME = 1024

# A \\ (an escaped backslash: what follows it is not an escape), a surrogate pair, or a lone
# surrogate escape, which the replacement turns into U+FFFD.
_SURROGATE_ESCAPES = re.compile(
    r"\\\\"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    r"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)


def _replace_escape(match: re.Match[str]) -> str:
    escape = match[0]
    return "\\ufffd" if len(escape) == 6 else escape


def parse_json(text: str) -> Any:
    """Parse a JSON document, lone surrogates read as U+FFFD.

    The value of the JSON document ``text``, every lone surrogate escape in it read as
    U+FFFD (a valid pair stays the character it encodes).

    Raises ``ValueError`` (the message says why) for text that is not JSON, nests too deeply,
    or is larger than ``_CHECKED_CHARS`` and holds more than ``MAX_JSON_ITEMS`` commas and
    colons outside its strings.
    """
    if len(text) > _CHECKED_CHARS:
        # Counted at C speed: first all of them; only if that is too many, those outside strings
        # (prose and code in a long string hold plenty).
        items = _separators(text)
        if items > MAX_JSON_ITEMS and (items := _structure(text)) > MAX_JSON_ITEMS:
            raise ValueError(
                f"{len(text)} characters holding {items} commas and colons outside strings, "
                f"more than the {MAX_JSON_ITEMS} this adapter parses in one document"
            )
    if "\\ud" in text or "\\uD" in text:
        text = _SURROGATE_ESCAPES.sub(_replace_escape, text)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _separators(text: str) -> int:
    """The commas and colons of ``text``.

    A JSON document has about one per value and key (the first value of each container aside, and
    any in its strings).
    """
    return text.count(",") + text.count(":")


def _structure(text: str) -> int:
    """The commas and colons outside the strings of the JSON text ``text``."""
    # Without escaped backslashes and quotes, every quote left opens or closes a string.
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    quotes = text.count('"')
    if quotes > 4 * MAX_JSON_ITEMS:
        # That many strings are that many keys and values, with a comma or colon between each
        # two: no need to split them to know.
        return quotes // 2
    return _separators("".join(text.split('"')[::2]))


def encode_body(body: Any) -> bytes:
    """``body`` as UTF-8 JSON.

    A lone surrogate anywhere in it is sent as U+FFFD and a pair of surrogates as the character it
    encodes (Python strings may hold both, UTF-8 neither).

    Raises ``TypeError`` or ``ValueError`` for a value JSON cannot hold.
    """
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return valid_text(text).encode()


def valid_text(text: str) -> str:
    """``text`` with its lone surrogates replaced by U+FFFD and its surrogate pairs joined."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def shorten(text: str, limit: int = _SNIPPET) -> str:
    """``text`` cut to ``limit`` characters, marking the cut, for error messages."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def encode_message(message: Message) -> dict[str, Any]:
    """One conversation message as a Chat Completions message object."""
    if isinstance(message, UserMessage):
        return {"role": "user", "content": message.content}
    if isinstance(message, AgentMessage):
        # Completion notices and other runtime additions are context the model should read as
        # user-side input; Chat Completions has no other role for them.
        return {"role": "user", "content": message.content}
    if isinstance(message, AssistantMessage):
        if not message.tool_calls:
            return {"role": "assistant", "content": message.content}
        return {
            "role": "assistant",
            # null, not "", is the canonical "no text" of a tool-calling assistant turn.
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(dict(call.arguments), ensure_ascii=False),
                    },
                }
                for call in message.tool_calls
            ],
        }
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.call_id, "content": message.text}
    raise TypeError(f"cannot send a {type(message).__name__} to a Chat Completions model")


def encode_tools(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as Chat Completions ``tools`` entries."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            },
        }
        for spec in tools
    ]


def build_body(
    model: str,
    request: ModelRequest,
    *,
    temperature: float | None,
    max_tokens: int | None,
    extra_body: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON body of one streamed Chat Completions request.

    ``extra_body`` is merged last, so it can add provider-specific fields or override ours.
    """
    messages: list[dict[str, Any]] = []
    if request.system_prompt:
        messages.append({"role": "system", "content": request.system_prompt})
    messages.extend(encode_message(message) for message in request.messages)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = encode_tools(request.tools)
    if temperature is not None:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body.update(extra_body)
    return body


def error_detail(body: bytes) -> str:
    """The human-readable message of an error body, in the shapes OpenAI-compatible servers use.

    ``{"error": {"message": ..., "type": ..., "code": ...}}`` (OpenAI, vLLM, llama.cpp),
    ``{"error": "..."}``, ``{"message": ...}``, ``{"detail": ...}`` (FastAPI); anything else is
    returned as (shortened) text.
    """
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = parse_json(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, str) and error:
            return shorten(error)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail")
            if isinstance(message, str) and message:
                code = error.get("code") or error.get("type")
                suffix = f" [{code}]" if isinstance(code, str) and code else ""
                return shorten(message) + suffix
            if message:
                return shorten(json.dumps(message))
    return shorten(" ".join(text.split())) if text else "(empty response body)"


class SSEDecoder:
    """Collects the ``data`` of Server-Sent Events, line by line, as the SSE spec defines.

    ``feed`` takes one line without its line ending and returns the data of an event when the line
    completes one (a blank line), else ``None``. Comments and fields other than ``data`` are
    ignored.

    An event is handed out early, as if a blank line had ended it, once it holds more than
    ``max_lines`` data lines or ``max_chars`` characters of data: only a server that puts no blank
    lines between its events sends that many (``decode_event`` splits them), and so the work of
    decoding one event stays bounded.
    """

    def __init__(self, *, max_lines: int = 64, max_chars: int = 2**23) -> None:
        self._data: list[str] = []
        self._chars = 0
        self._max_lines = max_lines
        self._max_chars = max_chars

    def feed(self, line: str) -> list[str] | None:
        """The completed event's data lines, or ``None`` while an event is still open."""
        if not line:
            return self.flush() if self._data else None
        if line.startswith("data:"):
            value = line[6:] if line.startswith(" ", 5) else line[5:]
        elif line == "data":
            value = ""
        else:
            return None  # a comment, or a field other than data
        self._data.append(value)
        self._chars += len(value)
        if len(self._data) > self._max_lines or self._chars > self._max_chars:
            return self.flush()
        return None

    def flush(self) -> list[str] | None:
        """The data of an event the stream ended without terminating, if any."""
        data, self._data, self._chars = self._data, [], 0
        return data or None


def decode_event(data: list[str]) -> list[Any] | None:
    """The JSON chunks of one SSE event, or ``None`` for the ``[DONE]`` sentinel.

    Raises ``ModelError`` when the payload is not JSON (or not one ``parse_json`` takes).
    """
    if len(data) == 1:
        if data[0].strip() == "[DONE]":
            return None
        return [_parse_event(data[0])]
    joined = "\n".join(data)
    if joined.strip() == "[DONE]":
        return None
    try:
        return [parse_json(joined)]
    except ValueError:
        pass
    # Some servers omit the blank line between events, so one "event" holds several chunks.
    return [None if line.strip() == "[DONE]" else _parse_event(line) for line in data]


def _parse_event(text: str) -> Any:
    try:
        return parse_json(text)
    except ValueError as exc:
        raise ModelError(
            f"the model endpoint sent a malformed stream event (not JSON: {exc}): {shorten(text)!r}"
        ) from exc


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ResponseAccumulator:
    """Builds one ``ModelResponse`` from streamed chunks (or from one non-streamed body).

    What it holds is at most what it was given (the caller bounds the response); a delta costs
    constant time whatever came before it.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._by_id: dict[str, int] = {}  # for servers that send ids but no index
        self._max = -1  # the highest index of a call so far
        self._usage: Usage | None = None
        self.finish_reason: str | None = None
        #: the ``id`` and ``model`` the server's chunks name (the first of each), for the span
        self.response_id: str | None = None
        self.response_model: str | None = None

    def add_chunk(self, chunk: Any) -> str:
        """Take one decoded chunk; return the text it adds (``""`` if none).

        Raises ``ModelError`` for an error object, a chunk that is not a JSON object, more than
        ``MAX_TOOL_CALLS`` tool calls, or a tool name longer than ``MAX_TOOL_NAME``.
        """
        if not isinstance(chunk, dict):
            raise ModelError(
                f"the model endpoint sent a stream chunk that is not a JSON object: "
                f"{shorten(json.dumps(chunk))}"
            )
        if chunk.get("error"):
            raise _stream_error(chunk)
        if self.response_id is None and isinstance(chunk.get("id"), str):
            self.response_id = chunk["id"]
        if self.response_model is None and isinstance(chunk.get("model"), str):
            self.response_model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = Usage(
                input_tokens=_int(usage.get("prompt_tokens")),
                output_tokens=_int(usage.get("completion_tokens")),
            )
        choice = _first_choice(chunk.get("choices"))
        if choice is None:
            return ""
        reason = choice.get("finish_reason")
        if reason:
            self.finish_reason = shorten(reason, 100) if isinstance(reason, str) else "unknown"
        # "delta" in streamed chunks, "message" in a non-streamed body.
        delta = choice.get("delta") or choice.get("message") or {}
        if not isinstance(delta, dict):
            return ""
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    self._add_call_delta(call)
        text = "".join(
            part for part in (delta.get("content"), delta.get("refusal")) if isinstance(part, str)
        )
        if text:
            self._text.append(text)
        return text

    def _add_call_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index")
        call_id = delta.get("id")
        if not isinstance(call_id, str):
            call_id = ""
        if not isinstance(index, int):
            # Servers that omit "index" send either a new call (with a new id) or more of the last.
            if call_id in self._by_id:
                index = self._by_id[call_id]
            elif call_id or not self._calls:
                index = self._max + 1
            else:
                index = self._max
        partial = self._calls.get(index)
        if partial is None:
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise ModelError(
                    f"the model endpoint sent more than {MAX_TOOL_CALLS} tool calls in one answer"
                )
            partial = self._calls[index] = _PartialCall()
            self._max = max(self._max, index)
        if call_id:
            partial.id = call_id
            self._by_id.setdefault(call_id, index)
        function = delta.get("function")
        if not isinstance(function, dict):
            return
        name = function.get("name")
        # OpenAI sends the whole name once; tolerate servers that repeat it or send it in pieces.
        if isinstance(name, str) and name and name != partial.name:
            if len(partial.name) + len(name) > MAX_TOOL_NAME:
                raise ModelError(
                    f"the model endpoint sent a tool name longer than {MAX_TOOL_NAME} "
                    f"characters: {shorten(partial.name + name, 100)!r}"
                )
            partial.name += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            partial.arguments.append(arguments)
        elif isinstance(arguments, dict):
            partial.arguments.append(json.dumps(arguments, ensure_ascii=False))

    def response(self) -> ModelResponse:
        """The complete response. Raises ``ModelError`` for a call with unusable arguments."""
        calls = tuple(_finish_call(self._calls[index], index) for index in sorted(self._calls))
        message = AssistantMessage(content="".join(self._text), tool_calls=calls)
        return ModelResponse(message=message, usage=self._usage)


def _finish_call(partial: _PartialCall, index: int) -> ToolCall:
    if not partial.name:
        raise ModelError(
            f"the model sent tool call #{index} without a function name "
            f"(arguments {shorten(''.join(partial.arguments))!r})"
        )
    text = "".join(partial.arguments)
    if not text.strip():
        arguments: Any = {}
    else:
        try:
            arguments = parse_json(text)
        except ValueError as exc:
            raise ModelError(
                f"the model called tool {partial.name!r} with arguments that are not valid JSON "
                f"({exc}): {shorten(text)!r}"
            ) from exc
    if not isinstance(arguments, dict):
        raise ModelError(
            f"the model called tool {partial.name!r} with arguments that are not a JSON object: "
            f"{shorten(text)!r}"
        )
    return ToolCall(id=partial.id or f"call_{index}", name=partial.name, arguments=arguments)


def _first_choice(choices: Any) -> dict[str, Any] | None:
    if not isinstance(choices, list):
        return None
    for choice in choices:
        # Only n=1 is requested; ignore any other choice a server might add.
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _int(value: Any) -> int:
    """A token count: a non-negative int below 2**63, else 0."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return 0


def _stream_error(chunk: dict[str, Any]) -> ModelError:
    error = chunk["error"]
    detail = error_detail(json.dumps(chunk).encode())
    code = error.get("code") if isinstance(error, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    status = code if isinstance(code, int) else None
    if (status is not None and (status == 429 or status >= 500)) or kind in (
        "server_error",
        "rate_limit_exceeded",
        "overloaded_error",
    ):
        return TransientModelError(
            f"the model endpoint reported an error mid-stream: {detail}", status=status
        )
    return ModelError(f"the model endpoint reported an error mid-stream: {detail}", status=status)
