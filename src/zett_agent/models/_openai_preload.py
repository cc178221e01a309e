"""What ``OpenAIChatModel`` needs at its first request, imported ahead in a process pool's launcher.

The adapter's HTTP client (``zett_agent.models._http``, on asyncio streams) imports little, but
its first ``https://`` request builds the process's verifying SSL context, loading certifi's CA
bundle: tens of milliseconds and about a megabyte a child would otherwise pay on its own. Done
once in the launcher before it forks, every child shares it. The TLS handshake also encodes the
server's name with the ``idna`` codec, imported on first use: imported here too.
``OpenAIChatModel.child_preload`` names this module, so the subagent extensions preload it
whenever a child will run on ``OpenAIChatModel``.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401

import certifi  # noqa: F401

from zett_agent.models import _http
from zett_agent.models._http import default_ssl_context

__all__ = ["default_ssl_context"]

_http.default_ssl_context()
