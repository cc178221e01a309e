"""A tool per child: each served ``SubAgentDefinition`` as an MCP tool of its own.

The tool has the definition's name and description, and two arguments: ``prompt`` (the full
instructions) and an optional short ``description`` (what ``task_list`` shows). It declares
``execution.taskSupport: "optional"``:

- called plainly, it runs the child and answers with its report, sending the child's progress
  while it runs (when the call carries a progress token); cancelling the call kills the child;
- called as a task (``_tasks``), it answers at once with the task, and the child runs on.

Either way the child is a background task of the client's own extension session, so
``task_list`` and ``task_status`` show it too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zett_agent._tool_args import validate_arguments
from zett_agent.extensions._tasks._task import SubAgentTaskStatus

if TYPE_CHECKING:
    from zett_agent.agent import AgentRunContext
    from zett_agent.extensions._async_subagent import AsyncSubAgentExtension
    from zett_agent.extensions._definition import SubAgentDefinition
    from zett_agent.extensions._tasks._task import SubAgentTask

__all__ = ["MAX_DESCRIPTION_CHARS", "MAX_PROMPT_CHARS", "ChildTool", "ToolAnswer", "child_answer"]

#: the longest ``description`` argument (it is a label, not the instructions), as task_start's
MAX_DESCRIPTION_CHARS = 200
#: the longest ``prompt``, as task_start's
MAX_PROMPT_CHARS = 100_000


class ToolAnswer:
    """What a tool call answers, before it becomes the SDK's ``CallToolResult``.

    ``text`` is the one text block; ``structured`` the JSON object given as
    ``structuredContent`` (or ``None``); ``is_error`` marks a failed call.
    """

    __slots__ = ("is_error", "structured", "text")

    def __init__(
        self, text: str, *, structured: dict[str, Any] | None = None, is_error: bool = False
    ) -> None:
        self.text = text
        self.structured = structured
        self.is_error = is_error

    def wire(self) -> dict[str, Any]:
        """The answer as the spec's ``CallToolResult`` (camelCase keys)."""
        result: dict[str, Any] = {
            "content": [{"type": "text", "text": self.text}],
            "isError": self.is_error,
        }
        if self.structured is not None:
            result["structuredContent"] = self.structured
        return result


class ChildTool:
    """The MCP tool of one definition: its listing, its arguments, starting its child."""

    def __init__(self, extension: AsyncSubAgentExtension, definition: SubAgentDefinition) -> None:
        self.extension = extension
        self.definition = definition
        self.name = definition.name
        self.description = definition.description
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "prompt": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_PROMPT_CHARS,
                    "description": "the complete task for the child; it sees nothing else",
                },
                "description": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_DESCRIPTION_CHARS,
                    "description": "a short label for the task (3-8 words), shown in task_list",
                },
            },
            "required": ["prompt"],
            "additionalProperties": False,
        }

    async def start(self, context: AgentRunContext, arguments: Mapping[str, Any]) -> SubAgentTask:
        """Check the arguments and start the child; return its task while it runs.

        Raises:
            ToolArgumentError: the arguments do not match the schema.
            ValueError, TypeError, RuntimeError: the extension refused the start (an empty
                prompt, ``max_concurrent`` reached, the client left); the message says why.
        """
        validate_arguments(self.name, self.input_schema, dict(arguments))
        prompt = arguments["prompt"]
        description = arguments.get("description") or self.name
        return await self.extension.start(
            context, self.definition, description=description, prompt=prompt
        )


def child_answer(
    extension: AsyncSubAgentExtension, task: SubAgentTask, *, cancelled: bool = False
) -> ToolAnswer:
    """The answer of a child's tool once its child ended: its report, or why it has none.

    The text is the report of a ``completed`` child; for a ``failed`` or ``cancelled`` one it
    says so with the reason, and the answer is an error. ``structuredContent`` is the task's
    info as ``task_output`` gives it (its ``task_id``, turns, tokens...). ``cancelled``: a
    ``tasks/cancel`` stopped it, whatever the child ended with.
    """
    info = extension.task_info(task, include_output=True)
    structured = json.loads(json.dumps(info, default=str))
    if cancelled and task.status is not SubAgentTaskStatus.CANCELLED:
        structured["status"] = "cancelled"
        return ToolAnswer(
            "cancelled by tasks/cancel before it reported", structured=structured, is_error=True
        )
    if task.status is SubAgentTaskStatus.COMPLETED:
        return ToolAnswer(task.output or "", structured=structured)
    return ToolAnswer(
        f"{task.status.value}: {task.error or 'no reason given'}",
        structured=structured,
        is_error=True,
    )
