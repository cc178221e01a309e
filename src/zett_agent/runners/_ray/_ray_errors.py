"""The Ray runner's own error, and how a child's outcome travels from its node to the driver.

The node's pool settles a child with one of the engine's errors; the task on the node sends it
to the driver as a small JSON record (``encode_error``), and the driver turns the record back
into the same error (``decode_error``). The record names a class from a fixed list and carries
its constructor's arguments; the driver checks every field's type and cuts every text, so what
arrives is at most a few tens of kilobytes whatever the node sent.

Imported on both sides (by the driver and by the task in a Ray worker); it imports no Ray.
"""

from __future__ import annotations

from typing import Any

from zett_agent import process

__all__ = ["NodeLost", "decode_error", "encode_error", "first_line"]

#: longest text field of a record (a traceback is cut to its end)
MAX_TEXT = 20_000
#: longest list of names in a record (``SandboxUnavailable.missing``)
MAX_NAMES = 32


class NodeLost(process.ProcessError):
    """The Ray node running the child died or left the cluster (or the whole cluster went away).

    Attributes:
        node_id: The node's hex id (``None`` when the child had not started yet).
        detail: Ray's first line about it.
    """

    def __init__(self, node_id: str | None, detail: str = "") -> None:
        self.node_id = node_id
        self.detail = detail
        super().__init__(node_id, detail)

    def __str__(self) -> str:
        where = f"the Ray node {self.node_id[:12]}" if self.node_id else "its Ray node"
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"{where} died or left the cluster while the child ran{detail}; the child was not "
            "retried (max_retries=0): start it again"
        )[:500]

    def __reduce__(self) -> tuple[type[NodeLost], tuple[str | None, str]]:
        return (type(self), (self.node_id, self.detail))


def first_line(error: BaseException) -> str:
    """The first line of ``str(error)``, at most 300 characters (its type name if empty)."""
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def encode_error(error: BaseException) -> dict[str, Any]:
    """The record of one of the engine's errors (any other exception: a ``JobFailed`` of it)."""
    if isinstance(error, process.JobFailed):
        return {"c": "JobFailed", "a": [error.type_name, error.message, error.traceback_text]}
    if isinstance(error, process.WorkerCrashed):
        return {"c": "WorkerCrashed", "a": [error.exitcode, error.signal_name, error.reason]}
    if isinstance(error, process.LimitExceeded):
        return {"c": "LimitExceeded", "a": [error.limit, error.value, error.reached]}
    if isinstance(error, process.JobTimeout):
        return {"c": "JobTimeout", "a": [error.timeout]}
    if isinstance(error, process.ProtocolError):
        return {"c": "ProtocolError", "a": [error.reason]}
    if isinstance(error, process.SandboxUnavailable):
        return {"c": "SandboxUnavailable", "a": [str(error), list(error.missing)]}
    for kind in (process.JobCancelled, process.PoolClosed, NodeLost, process.ProcessError):
        if type(error) is kind:
            if kind is NodeLost:
                assert isinstance(error, NodeLost)
                return {"c": "NodeLost", "a": [error.node_id, error.detail]}
            return {"c": kind.__name__, "a": [str(error)]}
    kind_name = type(error).__qualname__
    if type(error).__module__ != "builtins":
        kind_name = f"{type(error).__module__}.{kind_name}"
    return {"c": "JobFailed", "a": [kind_name, str(error), ""]}


def _text(value: object, default: str = "") -> str:
    return value[-MAX_TEXT:] if isinstance(value, str) else default


def _head(value: object, default: str = "") -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else default


def _optional_text(value: object) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decode_error(record: object) -> process.ProcessError:
    """The error a record names; a ``ProtocolError`` for one that is malformed. Never raises.

    Every field is checked for its type and every text cut to ``MAX_TEXT`` characters, so a
    record costs the driver a bounded amount of work and memory whatever it holds.
    """
    if not isinstance(record, dict) or not isinstance(record.get("a"), list):
        return process.ProtocolError("the Ray task sent a malformed error record")
    kind, args = record.get("c"), list(record["a"])[:4]
    args += [None] * (4 - len(args))
    if kind == "JobFailed":
        return process.JobFailed(_head(args[0], "Exception")[:300], _head(args[1]), _text(args[2]))
    if kind == "WorkerCrashed":
        signal_name = _optional_text(args[1])
        return process.WorkerCrashed(
            _int(args[0]), signal_name and signal_name[:40], _optional_text(args[2])
        )
    if kind == "LimitExceeded":
        value = _number(args[1])
        if isinstance(args[0], str) and value is not None:
            return process.LimitExceeded(args[0][:40], value, _number(args[2]))
    elif kind == "JobTimeout":
        timeout = _number(args[0])
        if timeout is not None:
            return process.JobTimeout(timeout)
    elif kind == "ProtocolError":
        return process.ProtocolError(_head(args[0], "a malformed frame"))
    elif kind == "SandboxUnavailable":
        names = args[1] if isinstance(args[1], list) else []
        missing = [name[:40] for name in names[:MAX_NAMES] if isinstance(name, str)]
        return process.SandboxUnavailable(
            _head(args[0], "the sandbox could not be enforced"), missing
        )
    elif kind == "NodeLost":
        return NodeLost(_optional_text(args[0]), _head(args[1]))
    elif kind in ("JobCancelled", "PoolClosed", "ProcessError"):
        cls = {"JobCancelled": process.JobCancelled, "PoolClosed": process.PoolClosed}.get(
            kind, process.ProcessError
        )
        return cls(_head(args[0], "the child was stopped"))
    return process.ProtocolError(f"the Ray task sent an error record of unknown kind {kind!r:.60}")
