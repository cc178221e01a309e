"""The pool's own sockets, collected unclosed (an unclosed pool's objects form cycles): they close
quietly, since the pool's own warning is the one that names what the user made."""

from __future__ import annotations

import gc
import socket
import warnings

from zett_agent.process._host._owned import owned


def test_an_owned_socket_collected_unclosed_closes_without_a_warning_of_its_own() -> None:
    plain, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock = owned(plain)
    assert (sock.family, sock.type) == (socket.AF_UNIX, socket.SOCK_SEQPACKET)
    assert plain.fileno() == -1  # detached: the connection is the owned socket's alone
    holder: list[object] = [sock]
    holder.append(holder)  # a cycle, collected in no fixed order
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del sock, holder
            gc.collect()
        assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
        assert peer.recv(16) == b""  # closed, not leaked: the peer reads the end
    finally:
        peer.close()
