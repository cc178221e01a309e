"""The channel of ``task_message`` into a Ray child: a Unix socket its node run opens.

A Ray task cannot be called while it runs, so each child's run on its node (``_ray_node``) opens a
Unix socket, ``NodeInbox``, in its Ray worker's private directory of inboxes (mode 0700,
``inbox_base``), and tells the driver its path and a random key in the stream (the ``inbox``
record, which is never written to the cluster's key-value store). The driver reaches it directly
when the node is its own machine, else through the node's reaper actor (``_ray_kill.Reaper.send``),
which runs on that node. Each message is one connection: one line, ``{"key": KEY, "message":
MESSAGE}``, answered by one line, ``{"ok": true}`` or ``{"ok": false, "error": TEXT}``. The inbox
hands the message to the child's ``ProcessJob.send`` (the engine's host-to-job messages, read by
the child's inbox, ``_child_inbox``), and the child's confirmation comes back as an event through
the run's stream, as every event does.

Bounded, since whoever reaches the socket may be hostile (a child that found it): a line of
at most ``MAX_LINE`` bytes, at most ``MAX_CONNECTIONS`` connections at once (more are closed
at once), ``CONNECTION_TIMEOUT`` seconds per connection, a wrong key refused, a message id
already accepted answered again without a second delivery (a retried call through a reaper
that did not answer in time delivers once).

The same socket takes the driver's request to stop the child, ``{"key": KEY, "stop": true}``
(``stop_run``): the run kills the child's tree through its pool and ends its Ray task on its
own, with an ``end`` record that says whether the tree is gone. The driver stops a running
child this way rather than with ``ray.cancel``: Ray's own cancel of a task whose reply is on
its way races Ray's bookkeeping in the driver, which then aborts the driver's process (Ray
2.60: "Check failed: it != submissible_tasks_.end()"); a task that ends on its own has no
such race. The answer is one of ``STOP_ANSWERS``: ``"taken"``; ``"ended"`` (the socket is gone
or the run said it ended: the run closes its inbox when it ends, so the task is ending on its
own, or its Ray worker died, which Ray reports; either way nothing is to be cancelled); or
``"unanswered"`` (no answer in time: the Ray worker is stopped or stuck).

A Ray worker's directory of inboxes is locked (``flock``) for as long as the worker lives, as a
pool's scratch base is (``process._scratch``). A worker that dies without removing it (Ray's
forced cancel, a crash: SIGKILL) leaves it behind with its lock free; the next Ray worker on the
machine to open an inbox removes such directories, in a thread of its own, within
``SWEEP_SECONDS`` (``sweep_stale``).

Stdlib and the engine only (no Ray): the node's Ray worker and the reaper import it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from zett_agent.process import ProcessJob
from zett_agent.process._sandbox import _scratch
from zett_agent.runners._child_inbox import MESSAGE_TOPIC

__all__ = [
    "CONNECTION_TIMEOUT",
    "MAX_LINE",
    "NodeInbox",
    "deliver",
    "deliver_blocking",
    "inbox_base",
    "request_line",
    "stop_run",
    "stop_run_blocking",
    "sweep_stale",
]

#: what ``stop_run`` answers (see the module docstring)
STOP_ANSWERS = ("taken", "ended", "unanswered")

#: longest request line (a message of ``MAX_MESSAGE_CHARS`` characters fits many times)
MAX_LINE = 1 << 20
#: longest answer line
MAX_ANSWER = 4096
#: connections an inbox serves at once
MAX_CONNECTIONS = 8
#: seconds one connection may take, from accept to answer (the job's backpressure included)
CONNECTION_TIMEOUT = 10.0
#: message ids an inbox remembers, to deliver a retried message once
MAX_REMEMBERED = 1024
#: the name of a Ray worker's directory of inboxes, in the temporary directory
INBOX_PREFIX = "zett-ray-inbox-"
#: seconds one sweep of dead workers' directories of inboxes may take
SWEEP_SECONDS = 2.0

_base: _scratch.Base | None = None
_base_lock = threading.Lock()


def inbox_base() -> _scratch.Base:
    """This process's directory of inboxes: made on first use, locked while the process lives.

    Making it starts one ``sweep_stale`` in a daemon thread, so the directories that Ray workers
    killed before they could remove theirs go as soon as another worker opens an inbox. The
    directory is removed at the interpreter's exit (a worker killed outright leaves it to the
    next sweep).
    """
    global _base
    with _base_lock:
        if _base is None:
            _base = _scratch.Base(prefix=INBOX_PREFIX, mode=0o700)
            atexit.register(_remove_base, _base)
            threading.Thread(target=sweep_stale, name="zett-ray-inbox-sweep", daemon=True).start()
        return _base


def _remove_base(base: _scratch.Base) -> None:
    _scratch.remove_tree(base.path)
    base.close()


def sweep_stale(directory: str | None = None, seconds: float = SWEEP_SECONDS) -> None:
    """Remove the directories of inboxes whose process is gone (their lock is free).

    Looks in ``directory`` (default: the temporary directory), at this user's only; stops after
    ``seconds`` whatever is left (what a dead worker's children put there is theirs to size).
    Never follows a symlink and never recurses (``_scratch.remove_tree``). Never raises.
    """
    deadline = time.monotonic() + seconds

    def late() -> bool:
        return time.monotonic() > deadline

    with contextlib.suppress(OSError):
        for path in _scratch.stale_bases(directory, prefix=INBOX_PREFIX):
            if late() or not _scratch.remove_tree(path, late):
                return


def request_line(key: str, message: Any) -> bytes:
    """The request for ``message``; ``ValueError`` beyond ``MAX_LINE`` or for non-JSON data."""
    line = json.dumps({"key": key, "message": message}, allow_nan=False) + "\n"
    data = line.encode()
    if len(data) > MAX_LINE:
        raise ValueError(f"a message to a Ray child encodes to {len(data)} bytes, over {MAX_LINE}")
    return data


def _stop_line(key: str) -> bytes:
    return (json.dumps({"key": key, "stop": True}) + "\n").encode()


def _stop_answer(line: bytes) -> str:
    try:
        answer = json.loads(line)
    except ValueError:
        return "unanswered"
    if isinstance(answer, dict) and answer.get("ok") is True:
        return "taken"
    return "ended" if isinstance(answer, dict) else "unanswered"


async def stop_run(path: str, key: str, seconds: float) -> str:
    """Ask the run whose inbox is at ``path`` to stop its child; one of ``STOP_ANSWERS``.

    Never raises but for cancellation; bounded by ``seconds``.
    """
    writer = None
    try:
        async with asyncio.timeout(seconds):
            try:
                reader, writer = await asyncio.open_unix_connection(path, limit=MAX_ANSWER)
            except (FileNotFoundError, ConnectionRefusedError):
                return "ended"  # the run closed its inbox (it ended), or its worker is gone
            writer.write(_stop_line(key))
            await writer.drain()
            return _stop_answer(await reader.readline())
    except (OSError, TimeoutError, ValueError):
        return "unanswered"
    finally:
        if writer is not None:
            writer.close()


def stop_run_blocking(path: str, key: str, timeout: float) -> str:
    """``stop_run`` for a thread (the node's reaper)."""
    try:
        return _stop_answer(_exchange_blocking(path, _stop_line(key), timeout))
    except (FileNotFoundError, ConnectionRefusedError):
        return "ended"
    except OSError:
        return "unanswered"


def _exchange_blocking(path: str, line: bytes, timeout: float) -> bytes:
    """Connect to ``path``, send ``line``, return the answer line; ``OSError`` as the socket's."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(line)
        answer = b""
        while not answer.endswith(b"\n") and len(answer) < MAX_ANSWER:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = sock.recv(MAX_ANSWER)
            if not chunk:
                break
            answer += chunk
    return answer


def _answer(line: bytes) -> dict[str, Any]:
    """The inbox's answer; ``RuntimeError`` when it said no or answered nonsense."""
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        error = answer.get("error") if isinstance(answer, dict) else None
        raise RuntimeError(
            f"the child's node did not take the message: {str(error or 'no answer')[:300]}"
        )
    return answer


async def deliver(path: str, line: bytes, seconds: float) -> None:
    """Send one request to the inbox at ``path`` from an event loop; return once it took it.

    Raises:
        RuntimeError: the inbox is gone (the child ended), refused it, or did not answer
            within ``seconds`` (then the message may or may not have been taken).

    Cancellation: the connection is closed; the message may or may not have been taken.
    """
    writer = None
    try:
        async with asyncio.timeout(seconds):
            reader, writer = await asyncio.open_unix_connection(path, limit=MAX_ANSWER)
            writer.write(line)
            await writer.drain()
            answer = await reader.readline()
    except (OSError, TimeoutError, ValueError) as error:
        raise RuntimeError(f"the child's inbox cannot be reached: {error!r:.200}") from None
    finally:
        if writer is not None:
            writer.close()
    _answer(answer)


def deliver_blocking(path: str, line: bytes, timeout: float) -> bool:
    """``deliver`` for a thread (the node's reaper): True once taken, else ``RuntimeError``."""
    try:
        answer = _exchange_blocking(path, line, timeout)
    except OSError as error:
        raise RuntimeError(f"the child's inbox cannot be reached: {error!r:.200}") from None
    _answer(answer)
    return True


class NodeInbox:
    """One child's inbox on its node: a Unix socket served on the node's event loop.

    ``job()`` returns the child's job once it was submitted (``None`` before); ``stop()``
    stops the child's run (called on the node's loop, idempotent). The socket is made in
    ``directory`` (default: this process's ``inbox_base()``). Created and closed on the
    node's loop; ``close`` is idempotent and removes the socket. Messages
    that come after the job ended, or before it was submitted, are answered with an error
    (the driver reports them undelivered).
    """

    def __init__(
        self,
        job: Callable[[], ProcessJob | None],
        stop: Callable[[], None] = lambda: None,
        directory: str | None = None,
    ) -> None:
        self._job = job
        self._stop = stop
        self.key = secrets.token_hex(16)
        # default: this process's directory of inboxes, mode 0700 (this user only)
        directory = directory if directory is not None else inbox_base().path
        self.path = os.path.join(directory, secrets.token_hex(8))
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._seen: set[str] = set()
        self._closed = False

    async def start(self) -> None:
        """Listen; ``OSError`` if the socket cannot be made (nothing is left of it)."""
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, self.path, limit=MAX_LINE + 1
            )
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        """Stop listening, cut the connections under way, remove the socket."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= MAX_CONNECTIONS or self._closed:
            writer.close()
            return
        self._writers.add(writer)
        try:
            async with asyncio.timeout(CONNECTION_TIMEOUT):
                answer = await self._take(await reader.readline())
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        except (OSError, TimeoutError, ValueError):
            pass  # the sender sees no answer: not taken, as far as it knows
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _take(self, line: bytes) -> dict[str, Any]:
        """Check one request and hand its message to the job; the answer to send back."""
        if not line.endswith(b"\n"):
            return {"ok": False, "error": "a request is one line of at most 1 MiB"}
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "a request is one JSON object"}
        if not isinstance(request, dict) or not isinstance(request.get("key"), str):
            return {"ok": False, "error": "a request is one JSON object with a key"}
        if not hmac.compare_digest(request["key"].encode(), self.key.encode()):
            return {"ok": False, "error": "wrong key"}
        if request.get("stop") is True:
            if self._closed:
                return {"ok": False, "error": "the child's run has ended"}
            self._stop()
            return {"ok": True}
        message = request.get("message")
        ident = message.get("id") if isinstance(message, dict) else None
        if not isinstance(ident, str):
            return {"ok": False, "error": "a message is an object with an id"}
        if ident in self._seen:
            return {"ok": True}  # a retry of one taken before: taken once
        job = self._job()
        if self._closed or job is None or job.done():
            return {"ok": False, "error": "the child is not running"}
        try:
            await job.send(message, topic=MESSAGE_TOPIC)
        except (RuntimeError, TypeError, ValueError) as error:
            return {"ok": False, "error": str(error)[:300]}
        if len(self._seen) < MAX_REMEMBERED:
            self._seen.add(ident)
        return {"ok": True}
