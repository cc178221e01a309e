"""Jobs of the egress tests: each runs in a sandbox whose network is an ``Egress``.

Each attempt is made for real and reported as what came back (a body, a status, or the name of
the error), so a test asserts both the refusal and the legitimate use next to it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from zett_agent.process import emit


def attempt(action: Callable[[], Any]) -> Any:
    """What ``action()`` returned, or what it failed with (errno name, HTTP status, type)."""
    try:
        return action()
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode(errors="replace")}
    except socket.gaierror:
        return "gaierror"
    except OSError as exc:
        if exc.errno is not None:
            return errno.errorcode.get(exc.errno, str(exc.errno))
        reason = getattr(exc, "reason", None)
        if isinstance(reason, OSError) and reason.errno is not None:
            return errno.errorcode.get(reason.errno, str(reason.errno))
        return type(exc).__name__
    except Exception as exc:
        return type(exc).__name__


def proxy_address() -> tuple[str, int]:
    """Where the job's proxy listens (its ``HTTP_PROXY``)."""
    url = os.environ["HTTP_PROXY"]
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def raw_request(head: bytes) -> str:
    """Send ``head`` to the proxy as it is; the status line it answered (or how it closed)."""
    with socket.create_connection(proxy_address(), timeout=15) as sock:
        sock.sendall(head)
        answer = sock.recv(4096)
    return answer.split(b"\r\n", 1)[0].decode(errors="replace") if answer else "closed"


def socks5(host: str, port: int) -> int:
    """A SOCKS5 CONNECT to ``host`` (a name) through the proxy: the reply code (0: allowed)."""
    with socket.create_connection(proxy_address(), timeout=15) as sock:
        sock.sendall(b"\x05\x01\x00")
        if sock.recv(2) != b"\x05\x00":
            return -1
        name = host.encode()
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port))
        reply = sock.recv(10)
        if reply[1] == 0:
            sock.sendall(b"GET /socks HTTP/1.0\r\nHost: " + name + b"\r\n\r\n")
            if b" 200 " not in sock.recv(4096).split(b"\r\n", 1)[0]:
                return -2
        return reply[1]


def get(url: str, **kwargs: Any) -> Any:
    with urllib.request.urlopen(url, timeout=15, **kwargs) as response:
        return json.loads(response.read())


def clients(http_port: int, https_port: int, ca: str) -> dict[str, Any]:
    """The usual clients, unchanged: urllib, requests and httpx, plain HTTP and HTTPS."""
    import ssl

    import httpx
    import requests

    context = ssl.create_default_context(cafile=ca)
    plain = f"http://api.test:{http_port}/plain"
    tls = f"https://localhost:{https_port}/tls"
    with httpx.Client(verify=context, timeout=15) as client:
        via_httpx = attempt(lambda: client.get(tls).json())
    return {
        "env": sorted(name for name in os.environ if "proxy" in name.lower()),
        "urllib http": attempt(lambda: get(plain)),
        "urllib https": attempt(lambda: get(tls, context=context)),
        "requests http": attempt(lambda: requests.get(plain, timeout=15).json()),
        "httpx https": via_httpx,
        "socks5": attempt(lambda: socks5("api.test", http_port)),
    }


def attacks(http_port: int, host_service_port: int) -> dict[str, Any]:
    """Every way around the proxy this round of the tests knows, tried for real."""

    def tcp(host: str, port: int) -> str:
        with socket.create_connection((host, port), timeout=5):
            return "connected"

    def udp() -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"x", ("192.0.2.1", 53))
        return "sent"

    def connect(authority: str, host: str | None = None) -> str:
        header = f"Host: {host}\r\n" if host else ""
        return raw_request(f"CONNECT {authority} HTTP/1.1\r\n{header}\r\n".encode())

    port = http_port
    return {
        "direct tcp": attempt(lambda: tcp("192.0.2.1", 80)),
        "direct tcp, the proxy's port": attempt(lambda: tcp("192.0.2.1", proxy_address()[1])),
        "direct udp": attempt(udp),
        "dns": attempt(lambda: socket.getaddrinfo("example.com", 443)),
        "the host's loopback service": attempt(lambda: tcp("127.0.0.1", host_service_port)),
        "unix socket": attempt(lambda: socket.socket(socket.AF_UNIX).close()),
        "unlisted name": attempt(lambda: get(f"http://other.test:{port}/")),
        "listed name on a private address": connect(f"localhost:{port}"),
        "Host header of another target": connect(f"api.test:{port}", f"other.test:{port}"),
        "Host header of the same target": connect(f"api.test:{port}", f"API.test.:{port}"),
        "decimal literal": connect(f"2130706433:{port}"),
        "octal literal": connect(f"0177.0.0.1:{port}"),
        "short literal": connect(f"127.1:{port}"),
        "IPv6-mapped literal": connect(f"[::ffff:127.0.0.1]:{port}"),
        "plain HTTP to another Host": raw_request(
            f"GET http://api.test:{port}/ HTTP/1.1\r\nHost: other.test\r\n\r\n".encode()
        ),
        "origin-form request": raw_request(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"),
        "socks5 unlisted": attempt(lambda: socks5("other.test", port)),
    }


def hold(count: int) -> int:
    """Open ``count`` connections to the proxy and send half a request on each; wait."""
    held = []
    refused = 0
    for _ in range(count):
        sock = socket.create_connection(proxy_address(), timeout=15)
        sock.sendall(b"CONNECT api.test:1 HTTP/1.1\r\n")  # never finished
        held.append(sock)
    emit("holding")
    for sock in held:  # each is cut by the proxy (too slow, or one too many): read its end
        sock.settimeout(30)
        try:
            answer = sock.recv(4096)
        except OSError:
            answer = b""
        refused += not answer.startswith(b"HTTP/1.1 408")
        sock.close()
    return refused


def download(url: str) -> Any:
    """Read ``url`` through the proxy: how many bytes arrived, or how it failed."""

    def read() -> int:
        total = 0
        with urllib.request.urlopen(url, timeout=30) as response:
            while chunk := response.read(1 << 16):
                total += len(chunk)
        return total

    return attempt(read)


def send_descriptors(count: int) -> str:
    """Send ``count`` descriptors to the host along with an event, on the job's own channel.

    A descriptor a job sends is dropped by the kernel unless the host asked for one; the host
    asks only before the job runs (an ``Egress`` worker's listener), never while it runs.
    """
    from zett_agent.process._child import _worker
    from zett_agent.process._wire._protocol import HEADER

    channel = _worker.current_channel()
    assert channel is not None
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]

    def send_frame(payload: bytes) -> None:
        data = HEADER.pack(len(payload)) + payload
        sent = socket.send_fds(channel.sock, [data], fds)
        channel.sock.sendall(data[sent:])

    channel._send_frame = send_frame  # type: ignore[method-assign]
    emit("sent")
    for fd in fds:
        os.close(fd)
    return "done"


def _connect_through(sock: socket.socket, port: int) -> str:
    """Ask the proxy for a tunnel to ``api.test:port`` on ``sock``: its status line ("closed"
    if it closed first)."""
    sock.sendall(f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            return "closed"
        answer += chunk
    return answer.split(b"\r\n", 1)[0].decode()


def _read_all(sock: socket.socket) -> bytes:
    received = bytearray()
    while chunk := sock.recv(1 << 16):
        received += chunk
    return bytes(received)


def held_tunnel(port: int) -> Any:
    """A CONNECT tunnel held open (say "tunnel" and the congestion control a new TCP socket of
    the job gets) until the host's word; then one small GET through it: its status line."""
    from zett_agent.process._child._inbox import receive_blocking

    with socket.create_connection(proxy_address(), timeout=30) as sock:
        status = _connect_through(sock, port)
        if " 200 " not in status:
            return status
        with socket.socket() as fresh:
            chosen = fresh.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
            emit(["tunnel", chosen.rstrip(b"\0").decode()])
        receive_blocking(timeout=30)
        sock.sendall(f"GET /small HTTP/1.0\r\nHost: api.test:{port}\r\n\r\n".encode())
        return _read_all(sock).split(b"\r\n", 1)[0].decode()


def tunnel(port: int, size: int) -> Any:
    """Through a CONNECT tunnel: ask for ``size`` bytes, end the sending side (half-close), and
    read the answer to its end: ``[status line, body bytes]``."""
    with socket.create_connection(proxy_address(), timeout=30) as sock:
        status = _connect_through(sock, port)
        if " 200 " not in status:
            return [status, 0]
        emit("tunnel")
        sock.sendall(f"GET /big?size={size} HTTP/1.0\r\nHost: api.test:{port}\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)
        head, _, body = _read_all(sock).partition(b"\r\n\r\n")
    return [head.split(b"\r\n", 1)[0].decode(), len(body)]
