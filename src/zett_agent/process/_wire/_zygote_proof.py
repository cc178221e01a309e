"""How a host and a zygote (``_child._zygote``) find and know each other.

A zygote listens on an abstract UNIX socket whose name is derived, one way, from a secret
that only the pools allowed to use it hold, and from what it imported: ``/proc/net/unix``
lists the name to any process, which learns nothing of the secret from it. Before anything
else is said, each side proves that it holds the secret (an HMAC of the other's fresh
nonce): a host refuses a listener that took the name first (a child that saw it listed and
bound it while no zygote did), and a zygote refuses a peer that merely connected. On the
socket (``SOCK_SEQPACKET``, one message per record):

host -> zygote      ``NONCE`` random bytes
zygote -> host      ``proof(secret, b"zygote", host nonce)`` + ``NONCE`` random bytes
host -> zygote      ``proof(secret, b"host", zygote nonce)`` + the request (JSON), with the
                    launcher's end of a new control socket attached (SCM_RIGHTS)
zygote -> host      ``{"pid": P}`` (the launcher it forked) or ``{"error": "..."}`` (JSON)

Stdlib only: both sides import it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

__all__ = ["LIMITS", "NONCE", "PROOF", "proof", "socket_name", "valid"]

#: bytes of each side's nonce
NONCE = 32
#: bytes of a proof
PROOF = 32
#: the resource limits a launcher takes from its host, as it would through a ``posix_spawn``
LIMITS = ("RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_NPROC", "RLIMIT_STACK", "RLIMIT_AS")


def socket_name(secret: bytes, parts: Iterable[str]) -> bytes:
    """The abstract socket name of the zygote for ``secret`` and ``parts`` (what it imports)."""
    digest = hashlib.sha256(b"zett-zygote\0" + secret + b"\0" + "\0".join(parts).encode())
    return b"\0zett-zygote-" + digest.hexdigest()[:40].encode()


def proof(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    """What the side playing ``role`` sends to show it holds ``secret``, for the peer's nonce."""
    return hmac.new(secret, role + b"\0" + nonce, hashlib.sha256).digest()


def valid(secret: bytes, role: bytes, nonce: bytes, received: bytes) -> bool:
    """Whether ``received`` is the proof of ``role`` for ``nonce`` (compared in constant time)."""
    return hmac.compare_digest(proof(secret, role, nonce), received)
