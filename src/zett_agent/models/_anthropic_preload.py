"""What ``AnthropicModel`` needs at its first request, imported ahead in a process pool's launcher.

For children that call their model themselves (a brokered child holds a stand-in and imports
none of this): the SDK, what its first request imports lazily, and the process's TLS context,
once in the launcher so every child shares them. ``AnthropicModel.child_preload`` names it.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (a TLS handshake encodes the server's name with it)

import anthropic

from zett_agent.models._anthropic import AnthropicModel
from zett_agent.models._sdk_http import tls_context

__all__ = ["tls_context"]

tls_context()
# building a client as the adapter does imports what its first request would (the transport,
# its pool, the resources' modules); it holds no connection, so dropping it closes nothing
_CLIENT = AnthropicModel._sdk_client(anthropic, "http://127.0.0.1", 1.0)
_CLIENT.messages  # noqa: B018 (imports the resources' modules)
del _CLIENT
