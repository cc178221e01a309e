"""Fixtures the reliability tests share."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def abstract_server() -> Iterator[bytes]:
    """An abstract UNIX socket this test process listens on: outside every worker's domain."""
    name = b"zett-test-" + os.urandom(6).hex().encode()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(b"\0" + name)
    server.listen(8)
    yield name
    server.close()
