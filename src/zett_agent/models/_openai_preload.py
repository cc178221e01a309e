"""What ``OpenAIChatModel`` needs at its first request, imported ahead in a process pool's launcher.

For children that call their model themselves (``ProcessRunner(broker=False)``; a brokered child
holds a stand-in and imports none of this). The SDK, its HTTP library and what their first
request imports lazily (the transport, the async backend), and the process's verifying TLS
context (certifi's CA bundle): hundreds of milliseconds and megabytes a child would otherwise
pay on its own. Done once in the launcher before it forks, every child shares it.
``OpenAIChatModel.child_preload`` names this module, so the subagent extensions preload it
whenever a child will call ``OpenAIChatModel`` itself.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (a TLS handshake encodes the server's name with it)

import openai

from zett_agent.models._openai import OpenAIChatModel
from zett_agent.models._sdk_http import tls_context

__all__ = ["tls_context"]

tls_context()
# building a client as the adapter does imports what its first request would (the transport,
# its pool, the resources' modules); it holds no connection, so dropping it closes nothing
_CLIENT = OpenAIChatModel._sdk_client(openai, "http://127.0.0.1/v1", 1.0)
_CLIENT.chat.completions  # noqa: B018 (imports the resources' modules)
del _CLIENT
