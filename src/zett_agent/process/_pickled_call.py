"""The Executor's call in its stdlib mode: pickled by the host, its outcome pickled by the worker.

``PoolExecutor`` in its default mode (``results="pickle"``) pickles ``fn(*args, **kwargs)``
itself, in ``submit``, and runs ``run`` in a worker with those bytes: ``run`` unpickles the call,
runs the executor's initializer first in a worker that has not run it, sets the host's
``multiprocessing`` authkey when it was sent, and returns the call's result or exception
pickled, as an opaque ``str`` inside an ordinary JSON result (its first two characters say what
it is and how its bytes are written; ``"rn"`` is ``None``: see ``outcome``). Only
``PoolExecutor`` submits ``run``, and only it unpickles what ``run`` returned (``outcome``):
what ``ProcessPool.submit`` and the agents' children send stays JSON that the host decodes and
never unpickles. The payload counts against the job's budget (``max_buffered_bytes``) like any
result.

``call_with_init`` is the same initializer for the strict mode (``results="json"``), whose
results stay JSON data. The worker imports this module (the launcher does, ahead): it imports
nothing heavy; what the host alone needs is imported where it is used.
"""

from __future__ import annotations

import binascii
import pickle
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "CALL_PROTOCOL",
    "InitializerFailed",
    "call_with_init",
    "outcome",
    "process_chunk",
    "run",
]

#: the pickle protocol of calls and outcomes
CALL_PROTOCOL = pickle.HIGHEST_PROTOCOL
#: what an outcome holds (its first character)
_RESULT, _ERROR, _INIT_FAILED = "r", "e", "i"
#: how its bytes are written (its second character): base64 (ASCII: a small outcome takes the
#: wire's fastest path), or one Latin-1 character per byte (a large one: no third more)
_BASE64, _LATIN1 = "b", "l"
#: the outcome of a call that returned ``None``
_NONE = "rn"
#: outcomes up to this many bytes are written in base64
_SMALL = 720

#: the executor whose initializer ran in this process (its token), None before any
_initialized: int | None = None


class InitializerFailed(Exception):
    """The executor's initializer raised in a worker; ``__cause__`` is what it raised."""


def _dumps(value: object) -> bytes:
    """``value`` pickled: by reference where that is safe, else with cloudpickle.

    What the job's ``__main__`` defined was sent by value (this worker never imported the
    host's ``__main__``), and must go back by value: cloudpickle then gives the host its own
    class again (it tracks the classes it sent by value).
    """
    try:
        data = pickle.dumps(value, CALL_PROTOCOL)
    except Exception:
        data = None
    if data is not None and b"__main__" not in data:
        return data
    import cloudpickle

    return bytes(cloudpickle.dumps(value, protocol=CALL_PROTOCOL))


def _write(kind: str, data: bytes) -> str:
    if len(data) <= _SMALL:
        return kind + _BASE64 + binascii.b2a_base64(data, newline=False).decode("ascii")
    return kind + _LATIN1 + data.decode("latin-1")


def _remote_traceback(exc: BaseException) -> str:
    """The traceback text the standard library's ``_RemoteTraceback`` carries."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f'\n"""\n{text}"""'


def _pickled_error(kind: str, exc: BaseException) -> str:
    """``exc`` and its traceback pickled; if ``exc`` cannot be, the error that says why."""
    trace = _remote_traceback(exc)
    exc.__traceback__ = None  # its frames hold every object of the job's scope
    try:
        return _write(kind, _dumps((exc, trace)))
    except BaseException as error:  # what the standard library does: the pickling error instead
        trace = _remote_traceback(error)
        error.__traceback__ = None
        try:
            return _write(kind, _dumps((error, trace)))
        except BaseException:
            text = f"{type(exc).__name__}: {exc!s:.2000}"
            fallback = RuntimeError(f"the job raised an exception that cannot be pickled: {text}")
            return _write(kind, _dumps((fallback, trace)))


def _initialize(init: tuple[int, bytes]) -> str | None:
    """Run the executor's initializer if this process has not; the pickled failure if it raised."""
    global _initialized
    token, data = init
    if _initialized == token:
        return None
    try:
        initializer, initargs = pickle.loads(data)
        initializer(*initargs)
    except BaseException as exc:
        import logging

        # what the standard library's worker logs, to the logger it logs to
        logging.getLogger("concurrent.futures").critical("Exception in initializer:", exc_info=True)
        return _pickled_error(_INIT_FAILED, exc)
    _initialized = token
    return None


def _set_authkey(authkey: bytes) -> None:
    from multiprocessing import process

    me = process.current_process()
    if bytes(me.authkey) != authkey:
        me.authkey = authkey


def _finish(result: Any) -> Any:
    if hasattr(result, "__await__"):  # as the pool runs a coroutine function's job
        import asyncio

        async def wait() -> Any:
            return await result

        return asyncio.run(wait())
    return result


def run(call: bytes, init: tuple[int, bytes] | None, authkey: bytes | None) -> str:
    """In the worker: run a pickled call; return its result or exception, pickled (``outcome``).

    Every exception of the call (``SystemExit`` and ``KeyboardInterrupt`` too, as the standard
    library's worker), of unpickling it, and of pickling its result comes back pickled, with
    its traceback's text.
    """
    if authkey is not None:
        _set_authkey(authkey)
    if init is not None:
        failed = _initialize(init)
        if failed is not None:
            return failed
    try:
        fn, args, kwargs = pickle.loads(call)
        result = _finish(fn(*args, **kwargs))
    except BaseException as exc:
        return _pickled_error(_ERROR, exc)
    if result is None:
        return _NONE  # the most common result, without a pickle
    try:
        data = _dumps(result)
    except BaseException as exc:
        return _pickled_error(_ERROR, exc)
    del result
    return _write(_RESULT, data)


def call_with_init(
    init: tuple[int, bytes], fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    """In the worker (strict mode): run the initializer if it has not run here, then the call.

    An initializer that raises fails the job with ``InitializerFailed``.
    """
    failed = _initialize(init)
    if failed is not None:
        raise InitializerFailed("the executor's initializer raised (logged in the worker)")
    return _finish(fn(*args, **kwargs))


def process_chunk(fn: Callable[..., Any], chunk: Iterable[tuple[Any, ...]]) -> list[Any]:
    """In the worker: one chunk of ``map(chunksize=N)``, as the standard library runs one."""
    return [fn(*args) for args in chunk]


def outcome(payload: object) -> tuple[str, Any]:
    """In the host: what ``run`` returned, unpickled: ``("result", value)``, ``("error", exc)``.

    Or ``("init", exc)`` when the executor's initializer raised. An exception comes with the
    worker's traceback as its ``__cause__`` (``concurrent.futures.process._RemoteTraceback``,
    as the standard library's). Raises what unpickling raises, and ``TypeError`` for a payload
    ``run`` never returns.

    The host unpickles only payloads of the executor's own jobs: this is the trust the standard
    library's executor places in its workers (docs/threat-model.md).
    """
    if payload == _NONE:
        return "result", None
    if not isinstance(payload, str) or len(payload) < 2 or payload[0] not in "rei":
        raise TypeError(f"not an outcome of the executor's call: {payload!r:.60}")
    kind, how = payload[0], payload[1]
    if how == _BASE64:
        data: bytes = binascii.a2b_base64(payload[2:])
    elif how == _LATIN1:
        data = memoryview(payload.encode("latin-1"))[2:]  # type: ignore[assignment]
    else:
        raise TypeError(f"not an outcome of the executor's call: {payload!r:.60}")
    value = pickle.loads(data)
    if kind == _RESULT:
        return "result", value
    from concurrent.futures.process import _RemoteTraceback

    exc, trace = value
    exc.__cause__ = _RemoteTraceback(trace)
    return ("error" if kind == _ERROR else "init"), exc
