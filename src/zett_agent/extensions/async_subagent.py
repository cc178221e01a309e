"""Background child agents, each in its own OS process, managed by the model with five tools."""

from __future__ import annotations

from zett_agent.extensions._async_subagent import AsyncSubAgentExtension
from zett_agent.extensions._tasks._store import TaskStore, TaskStoreError
from zett_agent.extensions._tasks._task import SubAgentTask, SubAgentTaskInfo, SubAgentTaskStatus

__all__ = [
    "AsyncSubAgentExtension",
    "SubAgentTask",
    "SubAgentTaskInfo",
    "SubAgentTaskStatus",
    "TaskStore",
    "TaskStoreError",
]
