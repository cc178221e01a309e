"""A brokered child holds no provider key: the key variables unset, their values wiped from memory.

A pool's processes inherit the environment their launcher was started with, so a key the
parent's adapters read from a variable (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, a model's
``api_key_env``) would be readable in every child: in ``os.environ``, in libc's environment and
in the block the interpreter was started with, which ``/proc/PID/environ`` reads. A brokered
child needs none of them (its parent makes its calls), so ``forget`` removes them first thing,
before the child's code is unpickled: each variable is unset, and the bytes of its value (and of
its ``NAME=value`` entry in the start-up block) are overwritten in this process's copy of the
memory it shares with the launcher. The launcher keeps them (children that call their model
themselves need them), and the runner retires the brokered child's worker once it has answered
(``retire_worker``): no later job in that process finds its variables gone.

``key_variables(models)`` is the parent's side: the default variables, and the ones its
brokered models name. Light: the standard library and ``ctypes``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

__all__ = ["KEY_VARIABLES", "forget", "key_variables"]

#: the variables the adapters read a key from by default (the Anthropic SDK's token too)
KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
#: where a bytes object's data starts (its header, without the trailing NUL)
_BYTES_DATA = bytes.__basicsize__ - 1
#: longest variable name taken from a model
_MAX_NAME = 256


def key_variables(models: Iterable[object]) -> tuple[str, ...]:
    """The variables a brokered child must not hold.

    The defaults, and each brokered model's ``api_key_env``.
    """
    names = dict.fromkeys(KEY_VARIABLES)
    for model in models:
        name = getattr(model, "api_key_env", None)
        if isinstance(name, str) and 0 < len(name) <= _MAX_NAME and "=" not in name:
            names.setdefault(name, None)
    return tuple(names)


def _start_up_block() -> tuple[int, int]:
    """Where the environment this process was started with lies in its memory, if readable.

    Fields 50 and 51 of ``/proc/PID/stat`` (a forked worker has its launcher's, at the same
    addresses).
    """
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rfind(b")") + 2 :].split()  # from field 3 on
        start, end = int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return (start, end) if 0 < start < end and end - start < 1 << 24 else (0, 0)


def forget(names: Iterable[str]) -> None:
    """Unset the variables ``names`` and overwrite their values in this process's memory.

    Variables that are not set are skipped; nothing here raises for a name (a name that is not
    a valid variable name is simply not found).
    """
    wanted = dict.fromkeys(
        name.encode() for name in names if name and "=" not in name and "\0" not in name
    )
    variables: dict[bytes, bytes] = getattr(os.environ, "_data", {})
    present = [name for name in wanted if name in variables]
    if not present:
        return
    for name in present:
        value = variables.pop(name)
        os.unsetenv(name)
        if len(value) > 1:  # one-byte values are shared objects
            ctypes.memset(id(value) + _BYTES_DATA, 0, len(value))
    start, end = _start_up_block()
    if not start:
        return
    block = ctypes.string_at(start, end - start)
    for name in present:
        entry = name + b"="
        at = -1
        while (at := block.find(entry, at + 1)) >= 0:
            if at == 0 or block[at - 1] == 0:  # the start of an entry, not inside a value
                stop = block.find(b"\0", at)
                stop = len(block) if stop < 0 else stop
                ctypes.memset(start + at, 0, stop - at)
    ctypes.memset(id(block) + _BYTES_DATA, 0, len(block))  # the copy read to search it
