"""The SDK an adapter is built on: an optional extra, imported at construction or named to install.

``sdk("openai", "OpenAIChatModel")`` returns the ``openai`` module, importing it on first use
(so importing ``zett_agent.models`` and unpickling a model stay cheap), or raises
``ImportError`` whose message is the exact command that installs the extra.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["sdk"]


def sdk(package: str, user: str) -> ModuleType:
    """The SDK module ``package`` (the extra of the same name), for ``user`` (a class name).

    Raises ``ImportError`` naming the install command when the SDK is not installed.
    """
    module = sys.modules.get(package)
    if module is not None:
        return module
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name != package:
            raise
        raise ImportError(
            f"{user} needs the official {package} SDK, an optional extra of zett-agent: "
            f"pip install 'zett-agent[{package}]' (or: uv add 'zett-agent[{package}]')"
        ) from None
