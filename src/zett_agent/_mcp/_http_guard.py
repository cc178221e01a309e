"""Who may talk to the HTTP server: its bearer token, and the Origin and Host checks.

Every request passes, in this order, before any MCP is read:

1. the path: only ``/mcp`` is served (404 otherwise);
2. DNS rebinding (the transport spec's MUST): a request whose ``Origin`` header is present
   must come from an allowed origin, ``http://`` or ``https://`` on ``127.0.0.1``,
   ``localhost`` or ``[::1]`` (any port) or one given with ``--allow-origin``; and while the
   server listens on a loopback address, its ``Host`` header must name that loopback address
   and port (403 otherwise). A request without ``Origin`` is a program's, not a page's;
3. the bearer token: ``Authorization: Bearer TOKEN`` with the server's token, compared in
   constant time (401 with ``WWW-Authenticate: Bearer`` otherwise).

A refusal is a JSON-RPC error (id null) whose message says what was wrong and how to fix it.
A browser page of an allowed origin gets the CORS answers it needs (the preflight, and the
headers a script may read), so a web app can call the server directly.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
from collections.abc import Iterable
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["MCP_PATH", "HttpGuard", "TokenError", "new_token", "read_token"]

#: where the server answers
MCP_PATH = "/mcp"

#: the shortest token read from a file: shorter ones are guessable
MIN_TOKEN_CHARS = 16
#: the longest: a token is one line of printable ASCII
MAX_TOKEN_CHARS = 4096

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")

#: what a browser page may send and read (the preflight's answer)
_ALLOW_HEADERS = (
    "authorization, content-type, accept, mcp-session-id, mcp-protocol-version, last-event-id"
)
_EXPOSE_HEADERS = "mcp-session-id, mcp-protocol-version, www-authenticate"


class TokenError(Exception):
    """The token file cannot be used; the message says why and how to fix it."""


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def read_token(path: str) -> str:
    """The token in ``path``: its one line, surrounding whitespace dropped.

    Raises:
        TokenError: the file cannot be read, is empty, or its token is too short, too long,
            or not printable ASCII without spaces.
    """
    try:
        text = Path(path).read_bytes()[: MAX_TOKEN_CHARS + 2].decode("ascii")
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TokenError(
            f"the token file {path!r} is not ASCII; put one token line in it"
        ) from None
    token = text.strip()
    if not token:
        raise TokenError(f"the token file {path!r} is empty; put one token line in it")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(
            f"the token in {path!r} has {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
            "(for example: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if len(token) > MAX_TOKEN_CHARS or any(not (33 <= ord(c) <= 126) for c in token):
        raise TokenError(
            f"the token in {path!r} must be one line of at most {MAX_TOKEN_CHARS} printable "
            "ASCII characters, without spaces"
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class HttpGuard:
    """The ASGI app that checks every request before handing it to ``app``.

    Args:
        app: The MCP app behind the checks.
        token: The bearer token every request must carry.
        host: The address the server listens on.
        port: Its port.
        origins: Origins allowed besides the loopback ones (``https://app.example``).
    """

    def __init__(
        self, app: ASGIApp, *, token: str, host: str, port: int, origins: Iterable[str] = ()
    ) -> None:
        self._app = app
        self._token = token.encode()
        self._origins = {origin.rstrip("/").lower() for origin in origins}
        self._hosts = {f"{name}:{port}" for name in _LOOPBACK_NAMES} if is_loopback(host) else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no websockets; lifespan is the server's own
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope["headers"]
        }
        origin = headers.get("origin")
        if scope["path"] != MCP_PATH:
            await _refuse(send, 404, f"Not Found: the MCP endpoint is {MCP_PATH}", origin=None)
            return
        if origin is not None and not self._origin_allowed(origin):
            await _refuse(
                send,
                403,
                f"Forbidden: Origin {origin[:200]!r} is not allowed (DNS rebinding protection); "
                "allowed are pages on 127.0.0.1, localhost and [::1], and the origins given with "
                "--allow-origin",
                origin=None,
            )
            return
        host = headers.get("host")
        if self._hosts is not None and host not in self._hosts:
            await _refuse(
                send,
                403,
                f"Forbidden: Host {(host or '')[:200]!r} is not this server's (DNS rebinding "
                f"protection); connect to one of: {', '.join(sorted(self._hosts))}",
                origin=origin,
            )
            return
        if scope["method"] == "OPTIONS" and origin is not None:
            await _preflight(send, origin)  # a page's preflight carries no token
            return
        if not self._authorized(headers.get("authorization")):
            given = "authorization" in headers
            await _refuse(
                send,
                401,
                (
                    "Unauthorized: the bearer token is wrong; send the token the server printed "
                    "(or the one in its --token-file)"
                    if given
                    else "Unauthorized: send the server's token as 'Authorization: Bearer TOKEN'"
                ),
                origin=origin,
                challenge='Bearer error="invalid_token"' if given else 'Bearer realm="mcp"',
            )
            return
        if origin is None:
            await self._app(scope, receive, send)
            return

        async def send_with_cors(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                extra = [
                    (b"access-control-allow-origin", origin.encode("latin-1")),
                    (b"access-control-expose-headers", _EXPOSE_HEADERS.encode()),
                    (b"vary", b"origin"),
                ]
                message = {**message, "headers": [*message.get("headers", []), *extra]}  # type: ignore[misc]
            await send(message)

        await self._app(scope, receive, send_with_cors)  # type: ignore[arg-type]

    def _origin_allowed(self, origin: str) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self._origins:
            return True
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme not in ("http", "https"):
            return False
        name = rest.rsplit(":", 1)[0] if not rest.endswith("]") else rest
        return name in _LOOPBACK_NAMES

    def _authorized(self, value: str | None) -> bool:
        if value is None:
            return False
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(token.strip().encode(), self._token)


async def _refuse(
    send: Send, status: int, message: str, *, origin: str | None, challenge: str | None = None
) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if challenge is not None:
        headers.append((b"www-authenticate", challenge.encode()))
    if origin is not None:
        headers.append((b"access-control-allow-origin", origin.encode("latin-1")))
        headers.append((b"access-control-expose-headers", _EXPOSE_HEADERS.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _preflight(send: Send, origin: str) -> None:
    headers = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
        (b"access-control-allow-headers", _ALLOW_HEADERS.encode()),
        (b"access-control-max-age", b"600"),
        (b"vary", b"origin"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
