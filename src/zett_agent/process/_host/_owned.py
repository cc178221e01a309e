"""Sockets a pool owns: collected unclosed, they close without a warning of their own.

A pool left unclosed warns once, naming what the user made (``ProcessPool.__del__``), and closes
its sockets so that its launcher kills every tree. Its engine's objects form reference cycles,
and the garbage collector finalizes the objects of a cycle in no fixed order: a socket finalized
before the pool would add a ``ResourceWarning`` of its own, about a socket the user never saw.
``OwnedSocket`` closes quietly instead; in everything else it is a ``socket.socket``.

Imported by the host's engine only.
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["OwnedSocket", "owned"]


class OwnedSocket(socket.socket):
    """A ``socket.socket`` whose owner warns when it is left unclosed (see the module)."""

    __slots__ = ()

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()


def owned(sock: socket.socket) -> OwnedSocket:
    """The same connection as ``sock`` (which is detached), as an ``OwnedSocket``."""
    return OwnedSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
