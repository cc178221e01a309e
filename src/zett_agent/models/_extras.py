"""The SDK an adapter is built on: an optional extra, checked at construction, imported at a call.

``require("openai", "OpenAIChatModel")`` (at construction) checks the SDK is installed without
importing it, so importing ``zett_agent``, building a model and unpickling one stay cheap (a
brokered parent's model is built long before its first call, and a brokered child never calls
it); ``await loaded("openai", "OpenAIChatModel")`` (at a model's first call) returns the module,
importing it in a thread the first time, so the import (a few hundred milliseconds of Python) does
not stall the event loop the call runs on. Each raises ``ImportError`` whose message is the exact
command that installs the extra.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
from types import ModuleType

__all__ = ["loaded", "require", "sdk"]

#: the SDKs imported to the end, by package name
_imported: dict[str, ModuleType] = {}


def _missing(package: str, user: str) -> ImportError:
    return ImportError(
        f"{user} needs the official {package} SDK, an optional extra of zett-agent: "
        f"pip install 'zett-agent[{package}]' (or: uv add 'zett-agent[{package}]')"
    )


def require(package: str, user: str) -> None:
    """Raise ``ImportError`` naming the install command unless the SDK ``package`` is installed.

    Imports nothing (``importlib.util.find_spec`` on the top-level package).
    """
    if package in sys.modules:
        if sys.modules[package] is None:  # blocked: ``sys.modules[name] = None``
            raise _missing(package, user)
        return
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise _missing(package, user)


def sdk(package: str, user: str) -> ModuleType:
    """The SDK module ``package`` (the extra of the same name), for ``user`` (a class name).

    Raises ``ImportError`` naming the install command when the SDK is not installed.
    """
    module = _imported.get(package)
    if module is not None:
        return module
    try:
        # not sys.modules: a module another thread is still importing is there, half built;
        # import_module waits for that import to finish
        module = importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name != package:
            raise
        raise _missing(package, user) from None
    _imported[package] = module
    return module


async def loaded(package: str, user: str) -> ModuleType:
    """``sdk(package, user)``, imported off the event loop the first time (in a thread)."""
    module = _imported.get(package)
    if module is not None:
        return module
    return await asyncio.to_thread(sdk, package, user)
