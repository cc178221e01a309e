"""``Sandbox(network=Egress(...))``: a job reaches only the hosts it may, through its parent.

The hosts are loopback servers of this test process (``api.test`` mapped to 127.0.0.1 by
``hosts=``, ``localhost`` for TLS); the job runs in a network namespace of its own whose only way
out is the proxy in this process. The usual clients work unchanged; every way around the proxy
is tried for real and refused, and each decision is counted on the job.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _egress_jobs as jobs
import pytest

from support.jobs import until
from support.openai_loopback import TEST_CA, TLS_DIR
from zett_agent.process import Egress, ProcessJob, ProcessPool, Sandbox, SandboxUnavailable
from zett_agent.process._host import _proxy, _splice
from zett_agent.process._sandbox._landlock import abi
from zett_agent.process._sandbox._options import sandbox_support
from zett_agent.process._sandbox._seccomp import available

GUARD = 60
_ABI, _WHY = abi()
pytestmark = pytest.mark.skipif(
    _ABI < 6 or not available()[0] or not sandbox_support()["namespaces"],
    reason=f"Egress needs Landlock ABI 6, seccomp and namespaces here (ABI {_ABI}: {_WHY})",
)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/big"):
            size = int(self.path.split("=", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[: min(size, len(chunk))])
                size -= len(chunk)
            self.wfile.flush()
            self.server.sent.set()  # type: ignore[attr-defined]
            return
        body = json.dumps({"path": self.path, "host": self.headers.get("Host")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sent = threading.Event()  # a /big answer was all handed to the kernel


class Servers:
    """A plain HTTP server and a TLS one on loopback, serving ``_Handler`` in threads."""

    def __init__(self) -> None:
        self.plain = _Server(("127.0.0.1", 0), _Handler)
        self.tls = _Server(("127.0.0.1", 0), _Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(TLS_DIR / "server.pem", TLS_DIR / "server.key")
        self.tls.socket = context.wrap_socket(self.tls.socket, server_side=True)
        self.threads = [
            threading.Thread(target=server.serve_forever, daemon=True)
            for server in (self.plain, self.tls)
        ]
        for thread in self.threads:
            thread.start()

    @property
    def http_port(self) -> int:
        return int(self.plain.server_address[1])

    @property
    def https_port(self) -> int:
        return int(self.tls.server_address[1])

    def close(self) -> None:
        for server in (self.plain, self.tls):
            server.shutdown()
            server.server_close()
        for thread in self.threads:
            thread.join()


@pytest.fixture
def servers() -> Iterator[Servers]:
    made = Servers()
    yield made
    made.close()


def egress(servers: Servers, **options: Any) -> Egress:
    return Egress(
        allow=[f"api.test:{servers.http_port}", f"localhost:{servers.https_port}"],
        hosts={"api.test": "127.0.0.1", "localhost": "127.0.0.1"},
        **options,
    )


def sandbox(egress: Egress) -> Sandbox:
    return Sandbox(network=egress, read=[str(TLS_DIR)])


async def outcome(job: ProcessJob) -> Any:
    async with asyncio.timeout(GUARD):
        return await job


async def test_the_usual_clients_work_unchanged_through_the_proxy(servers: Servers) -> None:
    async with ProcessPool(1) as pool:
        job = pool.submit(
            jobs.clients,
            servers.http_port,
            servers.https_port,
            TEST_CA,
            sandbox=sandbox(egress(servers)),
        )
        seen = await outcome(job)
    http_host = f"api.test:{servers.http_port}"
    assert seen["env"] == sorted(
        ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
    )
    assert seen["urllib http"] == {"path": "/plain", "host": http_host}
    assert seen["requests http"] == {"path": "/plain", "host": http_host}
    tls = {"path": "/tls", "host": f"localhost:{servers.https_port}"}
    assert seen["urllib https"] == tls and seen["httpx https"] == tls
    assert seen["socks5"] == 0  # SOCKS5 to the same listed host, then a request through it
    report = job.sandbox_report
    assert report is not None and report["namespaces"].endswith("net")
    assert report["egress"]["port"] > 0
    log = job.egress
    assert log is not None
    counts = log.counts()
    assert counts["allowed"] == 5 and counts["denied"] == 0 and counts["bytes"] > 0
    # a connection's end is recorded as the proxy sees it close (after the job may have ended)
    await until(lambda: sum(d["reason"] == "closed" for d in log.decisions) == 5, GUARD)
    allowed = [d for d in log.decisions if d["reason"] == "allowed"]
    closed = [d for d in log.decisions if d["reason"] == "closed"]
    assert len(allowed) == len(closed) == 5
    assert sum(d["bytes"] for d in closed) == counts["bytes"]


async def test_every_way_around_the_proxy_is_refused_and_counted(servers: Servers) -> None:
    async with ProcessPool(1) as pool:
        # localhost is listed but not pinned: the proxy resolves it itself, to loopback
        rules = Egress(
            allow=[f"api.test:{servers.http_port}", f"localhost:{servers.http_port}"],
            hosts={"api.test": "127.0.0.1"},
        )
        job = pool.submit(
            jobs.attacks, servers.http_port, servers.https_port, sandbox=sandbox(rules)
        )
        seen = await outcome(job)
    # no route but the proxy: Landlock lets the job connect to its proxy's port only, and the
    # namespace has loopback alone; no resolver; no UNIX socket (a daemon's is a way out)
    assert seen["direct tcp"] == "EACCES"
    assert seen["direct tcp, the proxy's port"] == "ENETUNREACH"
    assert seen["direct udp"] == "ENETUNREACH"
    assert seen["dns"] == "gaierror"
    assert seen["the host's loopback service"] in ("EACCES", "ECONNREFUSED")
    assert seen["unix socket"] == "EPERM"
    unlisted = seen["unlisted name"]
    assert unlisted["status"] == 403 and "other.test port" in unlisted["body"]
    assert "Egress(allow=[...])" in unlisted["body"]  # the body names the rule it failed
    forbidden = "HTTP/1.1 403 Forbidden"
    for name in (
        "listed name on a private address",  # localhost, resolved by the proxy: loopback
        "Host header of another target",
        "decimal literal",
        "octal literal",
        "short literal",
        "IPv6-mapped literal",
        "plain HTTP to another Host",
    ):
        assert seen[name] == forbidden, (name, seen[name])
    assert seen["Host header of the same target"] == "HTTP/1.1 200 Connection established"
    assert seen["origin-form request"] == "HTTP/1.1 400 Bad Request"
    assert seen["socks5 unlisted"] == 2  # SOCKS5: not allowed by ruleset
    log = job.egress
    assert log is not None
    denied = [d for d in log.decisions if not d["allowed"]]
    assert log.counts()["denied"] == len(denied) == 10
    assert log.counts()["allowed"] == 1  # the one CONNECT whose Host header matched
    reasons = " | ".join(d["reason"] for d in denied)
    assert "resolves only to loopback" in reasons and "is reached only when listed" in reasons


async def test_a_flood_and_a_slow_loris_are_cut_and_another_task_is_served(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_proxy, "HEAD_TIMEOUT", 1.0)
    async with ProcessPool(2) as pool:
        flood = pool.submit(jobs.hold, 8, sandbox=sandbox(egress(servers, max_connections=4)))
        async with asyncio.timeout(GUARD):
            async for event in flood.events():
                assert event == "holding"
                break
        # while one task holds its proxy's every slot, another's is served at once
        other = pool.submit(
            jobs.clients,
            servers.http_port,
            servers.https_port,
            TEST_CA,
            sandbox=sandbox(egress(servers)),
        )
        seen = await outcome(other)
        assert seen["urllib http"]["path"] == "/plain"
        refused = await outcome(flood)
    assert refused == 4  # four beyond max_connections, closed at once; four cut after 1 s
    log = flood.egress
    assert log is not None
    reasons = [d["reason"] for d in log.decisions]
    assert reasons.count("more than 4 connections") == 4
    assert reasons.count("no whole request within 1 seconds") == 4


async def test_max_bytes_cuts_a_transfer_under_way(servers: Servers) -> None:
    url = f"http://api.test:{servers.http_port}/big?size={4 << 20}"
    async with ProcessPool(1) as pool:
        small = pool.submit(jobs.download, url, sandbox=sandbox(egress(servers, max_bytes=1 << 20)))
        cut = await outcome(small)
        whole = pool.submit(jobs.download, url, sandbox=sandbox(egress(servers)))
        assert await outcome(whole) == 4 << 20
    assert not isinstance(cut, int) or cut < 1 << 20, cut
    log = small.egress
    assert log is not None
    assert any("max_bytes=1048576" in d["reason"] for d in log.decisions)
    assert log.counts()["bytes"] == 1 << 20  # to the byte: what would go past is never sent


async def test_a_tunnel_half_closed_by_the_job_still_brings_the_whole_answer(
    servers: Servers,
) -> None:
    """The job ends its sending side right after its request: the end goes on to the host, and
    the answer (8 MiB) still comes back whole, counted."""
    size = 8 << 20
    async with ProcessPool(1) as pool:
        job = pool.submit(jobs.tunnel, servers.http_port, size, sandbox=sandbox(egress(servers)))
        status, body = await outcome(job)
    assert (status, body) == ("HTTP/1.1 200 OK", size)
    log = job.egress
    assert log is not None
    closed = [d for d in log.decisions if d["reason"] == "closed"]
    assert len(closed) == 1 and closed[0]["bytes"] > size


async def test_bytes_move_while_the_parents_loop_is_blocked(servers: Servers) -> None:
    """The relay is not the loop's work: with the parent's event loop blocked, a 32 MiB answer
    (more than every socket buffer on its way holds) still leaves the server whole."""
    size = 32 << 20
    async with ProcessPool(1) as pool:
        job = pool.submit(jobs.tunnel, servers.http_port, size, sandbox=sandbox(egress(servers)))
        async with asyncio.timeout(GUARD):
            async for event in job.events():
                assert event == "tunnel"
                break
        # the loop is blocked here, on purpose, until the server handed over its last byte
        assert servers.plain.sent.wait(GUARD), "the transfer stopped with the loop"
        status, body = await outcome(job)
    assert (status, body) == ("HTTP/1.1 200 OK", size)


async def test_the_jobs_network_sends_unpaced(servers: Servers) -> None:
    """Reno, which never paces (BBR's pacing over the job's loopback cost a third of the
    throughput), in the job's network namespace: its own new sockets get it (where /proc/sys
    can be written), and so does the proxy's socket on the job's side of a tunnel (born from
    the job's listener); the upstream socket keeps the host's default."""
    default = _HOST_CONGESTION.read_text().strip().encode()  # noqa: ASYNC240 (/proc: at once)
    # where /proc/sys is mounted read-only (some containers), no namespace's default can be
    # written: the job's own sockets keep the host's, and only the listener's choice holds
    expected = default.decode() if os.statvfs("/proc/sys").f_flag & os.ST_RDONLY else "reno"
    async with ProcessPool(1) as pool:
        job = pool.submit(jobs.held_tunnel, servers.http_port, sandbox=sandbox(egress(servers)))
        async with asyncio.timeout(GUARD):
            async for event in job.events():
                assert event[0] == "tunnel", event
                assert event[1] == expected  # the namespace's default
                break
        relayed = _splice.splicer._pairs  # by each socket of each pair the relay thread serves
        await until(lambda: bool(relayed), what="the tunnel reaches the relay thread")
        (pair,) = set(relayed.values())
        assert _congestion(pair.client) == b"reno"
        assert _congestion(pair.upstream) == default
        await job.send("go")
        assert await outcome(job) == "HTTP/1.1 200 OK"


_HOST_CONGESTION = Path("/proc/sys/net/ipv4/tcp_congestion_control")

_LISTENER_IN_A_NEW_NAMESPACE = """
import os, socket
from zett_agent.process._sandbox import _view
# a namespace that keeps the host's default (nothing written to it), as where writing failed
_view._check(_view._unshare(_view._CLONE_NEWNET), "unshare(CLONE_NEWNET)")
with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
    default = f.read().strip()
listener = _view.loopback_listener()
client = socket.create_connection(listener.getsockname())
accepted, _ = listener.accept()
chosen = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
print(default, chosen.rstrip(b"\\0").decode())
"""


def test_the_proxys_side_is_born_unpaced_even_where_the_default_stays() -> None:
    """Where the namespace's default could not be written, the job's listener still chooses
    Reno, so each connection the proxy accepts (the side that sends a download) has it from
    its first packet (a socket switched later keeps pacing)."""
    if os.geteuid() != 0:
        pytest.skip("making a network namespace here needs root")
    done = subprocess.run(
        [sys.executable, "-c", _LISTENER_IN_A_NEW_NAMESPACE],
        capture_output=True, text=True, timeout=GUARD, check=True,
    )  # fmt: skip
    default, accepted = done.stdout.split()
    assert default == _HOST_CONGESTION.read_text().strip()
    assert accepted == "reno"


def _congestion(fd: int) -> bytes:
    sock = socket.socket(fileno=fd)
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")
    finally:
        sock.detach()


def _egress_inside_a_sandbox(port: int) -> Any:
    """In a sandboxed job: a pool of its own tries an Egress job (no namespace can be made)."""
    from zett_agent.process import Egress, ProcessPool, Sandbox

    async def run() -> Any:
        async with ProcessPool(1) as pool:
            job = pool.submit(
                sum, [1, 2], sandbox=Sandbox(network=Egress(allow=[f"a.test:{port}"]))
            )
            await job.wait()
            error = job.exception()
            return [type(error).__name__, getattr(error, "missing", None), str(error)]

    return asyncio.run(run())


async def test_without_a_network_namespace_an_egress_job_does_not_run() -> None:
    async with ProcessPool(1) as pool:
        job = pool.submit(_egress_inside_a_sandbox, 80, sandbox=Sandbox())
        name, missing, text = await outcome(job)
    assert name == SandboxUnavailable.__name__ and "netns" in missing, text
    assert "network namespace" in text


def test_egress_checks_its_patterns_at_construction() -> None:
    with pytest.raises(TypeError, match="list of host patterns"):
        Egress(allow="api.test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wildcard may only open a name"):
        Egress(allow=["api.*.test"])
    with pytest.raises(ValueError, match="port must be a number"):
        Egress(allow=["api.test:0"])
    with pytest.raises(ValueError, match="is not an address"):
        Egress(hosts={"api.test": "not-an-address"})
    with pytest.raises(ValueError, match="max_connections"):
        Egress(max_connections=0)


@pytest.mark.parametrize("with_egress", [True, False])
async def test_descriptors_a_job_sends_never_enter_the_host(
    servers: Servers, with_egress: bool
) -> None:
    """The leak guard counts the host's descriptors: none of the job's stays."""
    box = sandbox(egress(servers)) if with_egress else Sandbox(read=[str(TLS_DIR)])
    async with ProcessPool(1) as pool:
        job = pool.submit(jobs.send_descriptors, 64, sandbox=box)
        async with asyncio.timeout(GUARD):
            async for event in job.events():
                assert event == "sent"
        assert await outcome(job) == "done"
