"""Session storage: each session's conversation and the state its extensions keep."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from zett_agent._messages import Message

__all__ = ["InMemorySessionStore", "SessionData", "SessionStore"]


@dataclass(eq=False)
class SessionData:
    """One session: its messages (in order) and per-extension state dictionaries.

    The runtime mutates both in place while a request holds the session.
    """

    session_id: str
    messages: list[Message] = field(default_factory=list)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)


@runtime_checkable
class SessionStore(Protocol):
    """Where an agent keeps its sessions."""

    def load(self, session_id: str) -> SessionData:
        """Return the session, creating an empty one if it does not exist."""
        ...


class InMemorySessionStore:
    """Sessions kept in this process's memory for the lifetime of the store."""

    def __init__(self) -> None:
        self._sessions: dict[str, SessionData] = {}

    def load(self, session_id: str) -> SessionData:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = SessionData(session_id)
        return session

    def session_ids(self) -> tuple[str, ...]:
        """The ids of every session created so far, oldest first."""
        return tuple(self._sessions)

    def delete(self, session_id: str) -> None:
        """Forget a session; a missing one is ignored."""
        self._sessions.pop(session_id, None)
