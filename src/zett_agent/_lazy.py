"""Public names a module imports on first access (PEP 562), so that importing it stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    module: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for the names of ``homes``.

    ``homes`` maps a public name to the module it lives in. ``__getattr__`` imports that module
    on the first access and keeps the object in ``namespace`` (the module's ``globals()``), so
    later lookups are plain attribute reads; any other name raises ``AttributeError``, as
    Python's own does. ``__dir__`` lists ``namespace`` and every name of ``homes``, loaded or
    not.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
