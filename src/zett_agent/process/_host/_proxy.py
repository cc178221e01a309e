"""The parent's egress proxy for one sandboxed job: its only way out of its network namespace.

The job's worker made a network namespace with only loopback and a listening socket on it, and
handed the listening socket to the host (``_sandbox/_confine``); ``EgressProxy`` accepts the
job's connections on it, in the host's event loop, and for each one decides by the job's
``Egress`` rules (``_sandbox/_egress``):

- HTTP ``CONNECT host:port`` (what ``HTTPS_PROXY`` clients send): a tunnel once allowed. A
  ``Host`` header, when there is one, must name the same target;
- a plain HTTP request in absolute form (``GET http://host/path``, what ``HTTP_PROXY`` clients
  send): forwarded to that host with ``Connection: close``, the ``Host`` header checked the same
  way; the connection then belongs to that host only;
- SOCKS5 ``CONNECT`` (a first byte of 5), for other TCP: no authentication, names, IPv4 and
  IPv6 addresses.

A denied HTTP request gets ``403 Forbidden`` whose body names the rule it failed; a denied
SOCKS5 request the reply "not allowed by ruleset". The proxy resolves names itself (the job has
no resolver), and refuses a name whose addresses are all loopback, private, link-local or
multicast unless those addresses are listed. Every decision goes to the job's ``EgressLog`` as
it is made; an allowed connection's bytes once more when it ends.

Bounded against the job: a request head of at most 16 KiB that must arrive within
``HEAD_TIMEOUT`` seconds (a slow-loris is cut), at most ``max_connections`` open at once (the
next is closed at once), ``max_bytes`` moved in all (a transfer under way is cut), and a connect
deadline upstream. The loop only reads request heads and decides: once a connection is allowed
and its upstream reached, both sockets go to the relay thread (``_splice``), which moves their
bytes in the kernel with ``splice(2)`` (a side is read only as fast as the other takes it) and
tells the loop once, when the connection ended.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from .._sandbox._egress import Egress, EgressRules, Target, parse_target
from . import _splice

__all__ = ["HEAD_TIMEOUT", "EgressLog", "EgressProxy"]

log = logging.getLogger("zett_agent.process")

#: seconds a connection has to send its whole request head
HEAD_TIMEOUT = 10.0
#: seconds to resolve a name and to connect upstream
CONNECT_TIMEOUT = 10.0
#: longest request head (request line and headers, or a SOCKS5 request)
MAX_HEAD = 16 * 1024
#: what a client may send after its request head, before its tunnel opens
_EARLY = 256 * 1024

#: decisions a job's log keeps (the counts cover them all)
MAX_KEPT = 256


class EgressLog:
    """What one job's proxy decided: the counts, the latest decisions, and who listens.

    ``allowed`` and ``denied`` count decisions as they are made, ``bytes`` what allowed
    connections moved (both ways), as it moves. ``decisions`` keeps the latest ``MAX_KEPT``
    events: ``{"host", "port", "allowed", "reason", "bytes"}``, an allowed connection's once
    more when it ends, with its bytes (``"reason": "closed"``). ``listeners`` are called with
    each event (errors are logged).
    """

    def __init__(self) -> None:
        self.allowed = 0
        self.denied = 0
        self.bytes = 0
        self.decisions: deque[dict[str, Any]] = deque(maxlen=MAX_KEPT)
        self.listeners: list[Callable[[dict[str, Any]], object]] = []

    def counts(self) -> dict[str, int]:
        """``{"allowed": a, "denied": d, "bytes": b}``."""
        return {"allowed": self.allowed, "denied": self.denied, "bytes": self.bytes}

    def record(self, host: str, port: int, allowed: bool, reason: str, count: int) -> None:
        if reason != "closed":
            if allowed:
                self.allowed += 1
            else:
                self.denied += 1
        event = {"host": host, "port": port, "allowed": allowed, "reason": reason, "bytes": count}
        self.decisions.append(event)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                log.exception("an egress listener raised; ignored")


class EgressProxy:
    """Serves one job's connections from the listening socket its worker handed over.

    Every decision goes to ``log`` (``EgressLog``). ``close()`` stops accepting and aborts
    every connection (the job ended).
    """

    def __init__(self, egress: Egress, log: EgressLog) -> None:
        self.egress = egress
        self.rules: EgressRules = egress.rules()
        self.log = log
        self.bytes = 0
        self.open: set[_Client] = set()
        self.closed = False
        self._lock = threading.Lock()
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Task[None] | None = None

    def start(self, listener: socket.socket) -> None:
        """Accept the job's connections on ``listener`` (a listening TCP socket) until closed."""
        listener.setblocking(False)
        self._starting = asyncio.get_running_loop().create_task(self._serve(listener))

    async def _serve(self, listener: socket.socket) -> None:
        if self.closed:
            listener.close()
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), sock=listener)
        if self.closed:  # the job ended while the server started
            self._server.close()

    def close(self) -> None:
        """Stop accepting and abort every connection. Idempotent."""
        self.closed = True
        if self._server is not None:
            self._server.close()
        for client in list(self.open):
            client.abort()

    def admit(self, client: _Client) -> bool:
        """Whether one more connection may open (``max_connections`` at once)."""
        if self.closed or len(self.open) >= self.egress.max_connections:
            return False
        self.open.add(client)
        return True

    def take(self, count: int) -> int:
        """How many of ``count`` bytes may still move (``max_bytes``); counts those.

        Thread-safe: the relay thread calls it for every move (``_splice.Budget``).
        """
        limit = self.egress.max_bytes
        with self._lock:
            if limit is not None:
                count = max(0, min(count, limit - self.bytes))
            self.bytes += count
            self.log.bytes = self.bytes
        return count

    def decide(self, host: str, port: int, allowed: bool, reason: str, count: int) -> None:
        self.log.record(host, port, allowed, reason, count)


class _Client(asyncio.Protocol):
    """One connection from the job: its request, then the relay to its upstream."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.stage = "head"  # head -> deciding -> relay -> done
        self.target: Target | None = None
        self.host, self.port = "?", 0
        self.count = 0
        self.timer: asyncio.TimerHandle | None = None
        self.forward = b""  # what goes upstream first (a plain HTTP request's rewritten head)
        self.pair: _splice.Pair | None = None  # once relayed
        self.socks = False
        self.greeted = False  # a SOCKS5 client was told 'no authentication'

    # -- the job's side --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: typed, not checked
        self.transport = transport = cast(asyncio.Transport, transport)
        if not self.proxy.admit(self):
            self.proxy.decide(
                "?", 0, False, f"more than {self.proxy.egress.max_connections} connections", 0
            )
            transport.abort()
            self.stage = "done"
            return
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(HEAD_TIMEOUT, self._too_slow)

    def data_received(self, data: bytes) -> None:
        if self.stage == "head":
            self.head += data
            self._parse()
        # while deciding, more data may arrive (a client that does not wait for 200): kept
        elif self.stage == "deciding":
            self.head += data
            if len(self.head) > MAX_HEAD + _EARLY:
                self._deny("the client sent too much before the tunnel opened", 400)

    def eof_received(self) -> bool | None:
        self.abort()  # before its request was served
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    # -- parsing the request ------------------------------------------------------------------

    def _parse(self) -> None:
        if self.head[:1] == b"\x05":
            self.socks = True
            self._parse_socks()
            return
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD:
                self._deny("the request head is longer than 16 KiB", 431)
            return
        head, rest = bytes(self.head[:end]), bytes(self.head[end + 4 :])
        self.head = bytearray(rest)
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, uri, version = lines[0].split(" ")
            headers = [line.split(":", 1) for line in lines[1:]]
            if any(len(pair) != 2 for pair in headers):
                raise ValueError("a header line without ':'")
        except ValueError:
            self._deny("malformed request", 400)
            return
        host_headers = [value.strip() for name, value in headers if name.strip().lower() == "host"]
        if method == "CONNECT":
            self._connect_request(uri, host_headers)
        else:
            self._plain_request(method, uri, version, headers, host_headers)

    def _connect_request(self, authority: str, host_headers: list[str]) -> None:
        try:
            host, port = _authority(authority, default=None)
            target = parse_target(host, port)
        except ValueError as exc:
            self._deny(f"CONNECT {authority[:100]!r}: {exc}", 400)
            return
        if not self._same_host(target, host_headers):
            return
        self._decide(target)

    def _plain_request(
        self,
        method: str,
        uri: str,
        version: str,
        headers: list[list[str]],
        host_headers: list[str],
    ) -> None:
        if not uri.lower().startswith("http://"):
            self._deny(
                f"{method} {uri[:100]!r} is not a proxy request: HTTPS goes through CONNECT, "
                "plain HTTP in absolute form (http://host/path)",
                400,
            )
            return
        rest = uri[7:]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        authority, path = rest[:cut], rest[cut:] or "/"
        if "@" in authority:
            self._deny("a URL with credentials in its authority is refused", 400)
            return
        try:
            host, port = _authority(authority, default=80)
            target = parse_target(host, port)
        except ValueError as exc:
            self._deny(f"{uri[:100]!r}: {exc}", 400)
            return
        if not self._same_host(target, host_headers):
            return
        kept = [
            f"{name}:{value}"
            for name, value in headers
            if name.strip().lower() not in ("proxy-connection", "proxy-authorization", "connection")
        ]
        if not host_headers:
            kept.append(f"Host: {authority}")
        self.forward = (
            "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
        ).encode("latin-1")
        self._decide(target)

    def _same_host(self, target: Target, host_headers: list[str]) -> bool:
        """A ``Host`` header must name the target the request names (at most one of them)."""
        if not host_headers:
            return True
        if len(host_headers) > 1:
            self._deny("more than one Host header", 400)
            return False
        try:
            host, port = _authority(host_headers[0], default=target.port)
            named = parse_target(host, port)
        except ValueError:
            self._deny(f"the Host header {host_headers[0][:100]!r} is no host", 400)
            return False
        if (named.name, named.address, named.port) != (target.name, target.address, target.port):
            self._deny(
                f"the Host header names {named.host}:{named.port}, the request "
                f"{target.host}:{target.port}: one target per request",
                403,
                target,
            )
            return False
        return True

    def _parse_socks(self) -> None:
        data = bytes(self.head)
        if len(data) < 2 or len(data) < 2 + data[1]:
            return  # the greeting is not all here yet
        methods = data[2 : 2 + data[1]]
        request = data[2 + data[1] :]
        if b"\x00" not in methods:
            self._write(b"\x05\xff")
            self._deny("SOCKS5 without 'no authentication'", None)
            return
        if not self.greeted:
            self.greeted = True
            self._write(b"\x05\x00")
        if len(request) < 5:
            return
        version, command, _reserved, kind = request[:4]
        if version != 5 or command != 1:
            self._write(_socks_reply(7))
            self._deny(f"SOCKS5 command {command} (only CONNECT is served)", None)
            return
        try:
            if kind == 1:
                if len(request) < 10:
                    return
                host, port_bytes = socket.inet_ntop(socket.AF_INET, request[4:8]), request[8:10]
            elif kind == 4:
                if len(request) < 22:
                    return
                host, port_bytes = socket.inet_ntop(socket.AF_INET6, request[4:20]), request[20:22]
            elif kind == 3:
                size = request[4]
                if len(request) < 7 + size:
                    return
                host = request[5 : 5 + size].decode("ascii")
                port_bytes = request[5 + size : 7 + size]
            else:
                self._write(_socks_reply(8))
                self._deny(f"SOCKS5 address type {kind}", None)
                return
            target = parse_target(host, struct.unpack("!H", port_bytes)[0])
        except (ValueError, UnicodeError) as exc:
            self._write(_socks_reply(1))
            self._deny(f"SOCKS5: {exc}", None)
            return
        self.head = bytearray()
        self._decide(target)

    # -- deciding ------------------------------------------------------------------------------

    def _decide(self, target: Target) -> None:
        self.target, self.host, self.port = target, target.host, target.port
        reason = self.proxy.rules.decide(target)
        if reason is not None:
            self._deny(reason, 403, target)
            return
        self.stage = "deciding"
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        asyncio.get_running_loop().create_task(self._open(target))

    async def _open(self, target: Target) -> None:
        loop = asyncio.get_running_loop()
        upstream: socket.socket | None = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                addresses = await self._addresses(target)
                if not addresses:
                    self._deny(
                        f"{target.host} resolves only to loopback, private, link-local or "
                        "multicast addresses, which are reached only when listed as addresses",
                        403,
                        target,
                    )
                    return
                error: OSError | None = None
                for address in addresses:
                    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
                    sock = socket.socket(family, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    try:
                        await loop.sock_connect(sock, (str(address), target.port))
                    except OSError as exc:
                        sock.close()
                        error = exc
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    upstream = sock
                    break
                else:
                    raise error or OSError("no address to connect to")
        except (TimeoutError, OSError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
            self._deny(f"could not reach {target.host}:{target.port}: {reason}", 502, target)
            return
        if self.stage != "deciding":  # the job closed meanwhile
            upstream.close()
            return
        self._relay(target, upstream)

    def _relay(self, target: Target, upstream: socket.socket) -> None:
        """Hand the job's connection and ``upstream`` to the relay thread (``_splice``)."""
        transport = self.transport
        assert transport is not None
        if transport.is_closing():
            upstream.close()
            return
        if transport.get_write_buffer_size():
            upstream.close()  # it never read the 2-byte SOCKS greeting: it reads nothing
            self._deny("the client does not read what the proxy sends", 400, target)
            return
        try:
            client = os.dup(transport.get_extra_info("socket").fileno())
        except OSError as exc:  # out of descriptors
            upstream.close()
            self._deny(f"the parent could not relay: {exc.strerror or exc}", 502, target)
            return
        self.proxy.decide(target.host, target.port, True, "allowed", 0)
        first, self.head = self.forward + bytes(self.head), bytearray()
        allowed = self._count(len(first))
        if allowed < len(first):
            os.close(client)
            upstream.close()
            self._cut()
            return
        if self.socks:
            reply = _socks_reply(0)
        else:
            reply = b"" if self.forward else b"HTTP/1.1 200 Connection established\r\n\r\n"
        self.stage = "relay"
        loop = asyncio.get_running_loop()
        self.pair = pair = _splice.Pair(
            client, upstream.detach(), self.proxy, loop, self._relayed, first, reply
        )
        # the loop lets go of the job's socket: the connection lives on in ``client``
        transport.abort()
        try:
            _splice.splicer.add(pair)  # closes the pair's sockets when it fails
        except (RuntimeError, OSError) as exc:  # no thread (at exit), no descriptor for a pipe
            self.pair = None
            self.stage = "done"
            self.proxy.open.discard(self)
            reason = f"the parent could not relay: {exc}"
            self.proxy.decide(self.host, self.port, False, reason, self.count)

    def _relayed(self, count: int, cut: bool) -> None:
        """The relay thread ended this connection, having moved ``count`` bytes."""
        self.pair = None
        self.count += count
        self.stage = "done"
        self.proxy.open.discard(self)
        if cut:
            limit = self.proxy.egress.max_bytes
            reason = f"the task moved more than max_bytes={limit}"
            self.proxy.decide(self.host, self.port, False, reason, self.count)
        else:
            self.proxy.decide(self.host, self.port, True, "closed", self.count)

    async def _addresses(self, target: Target) -> list[Any]:
        rules = self.proxy.rules
        if target.address is not None:
            return [target.address]  # allowed as an address: reached as it is
        assert target.name is not None
        pinned = rules.pinned(target.name)
        if pinned is not None:
            return [pinned]  # a name of hosts=: trusted at its address
        infos = await asyncio.get_running_loop().getaddrinfo(
            target.name, target.port, type=socket.SOCK_STREAM
        )
        found = []
        for _family, _type, _proto, _name, sockaddr in infos:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
            if rules.reachable(address, target.port) and address not in found:
                found.append(address)
        return found

    def _deny(self, reason: str, status: int | None, target: Target | None = None) -> None:
        if self.stage == "done":
            return
        self.stage = "done"
        if target is not None:
            self.host, self.port = target.host, target.port
        self.proxy.decide(self.host, self.port, False, reason, 0)
        if status is not None and not self.socks:
            body = f"egress denied: {reason}\n".encode("utf-8", "replace")
            phrase = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large",
                      502: "Bad Gateway"}.get(status, "Error")  # fmt: skip
            self._write(
                f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
        elif self.socks and status is not None:
            self._write(_socks_reply(2 if status == 403 else 4 if status == 502 else 1))
        if self.transport is not None:
            self.transport.close()  # after what was written

    def _too_slow(self) -> None:
        self.timer = None
        if self.stage == "head":
            self._deny(f"no whole request within {HEAD_TIMEOUT:g} seconds", 408)

    # -- ending --------------------------------------------------------------------------------

    def _count(self, size: int) -> int:
        allowed = self.proxy.take(size)
        self.count += allowed
        return allowed

    def _cut(self) -> None:
        """The task reached ``max_bytes`` before this connection was relayed: it ends."""
        limit = self.proxy.egress.max_bytes
        self.proxy.decide(
            self.host, self.port, False, f"the task moved more than max_bytes={limit}", self.count
        )
        self.stage = "done"
        self.abort()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self) -> None:
        if self.pair is not None:
            _splice.splicer.drop(self.pair)  # its end comes back through ``_relayed``
        elif self.transport is not None:
            self.transport.abort()

    def _end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.stage == "relay":
            return  # the relay thread has the connection now
        self.proxy.open.discard(self)
        self.stage = "done"


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])


def _authority(text: str, default: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) split; ``default`` when there is no port (else an error)."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("an IPv6 address needs its closing ']'")
        host, rest = text[1:end], text[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            raise ValueError("write [address]:port")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        host, port_text = text, None  # a bare IPv6 address
    else:
        host, port_text = text, None
    if port_text is None:
        if default is None:
            raise ValueError("CONNECT needs host:port")
        return host, default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"port {port_text[:10]!r} is out of range")
    return host, int(port_text)
