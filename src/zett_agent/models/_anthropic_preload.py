"""What ``AnthropicModel`` needs at its first request, imported ahead in a process pool's launcher.

For children that call their model themselves (a brokered child holds a stand-in and imports
none of this): the SDK, what its first request imports lazily, and the process's TLS context,
once in the launcher so every child shares them. ``AnthropicModel.child_preload`` names it.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (a TLS handshake encodes the server's name with it)

import anthropic

from zett_agent.models._sdk_http import NO_KEY, http_client, tls_context

__all__ = ["tls_context"]

tls_context()
# building a client imports what its first request would; it holds no connection
_CLIENT = anthropic.AsyncAnthropic(
    api_key=NO_KEY,
    base_url="http://127.0.0.1",
    max_retries=0,
    http_client=http_client(anthropic.DefaultAsyncHttpxClient, timeout=1.0, json_as_event=False),
)
_CLIENT.messages  # noqa: B018 (imports the resources' modules)
del _CLIENT
