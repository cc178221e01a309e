"""A driver that starts a local Ray through ``RayRunner(address=None)``, runs one child there,
and prints as one JSON line (for ``test_ray_local.py``) how many idle workers ran right after
``connect()`` (it asks for ``prestart_workers=PRESTART``) and every listening TCP socket of that
Ray's processes: ``[[address, port, pid, command], ...]``.

Run in a process of its own: a local Ray is started once per process, and this process must not
be a driver of the tests' cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys

import psutil

from zett_agent.runners.ray import RayRunner

LISTEN = "0A"
#: workers the local Ray starts in ``connect()`` (more than its one CPU per core would keep)
PRESTART = 4


def _addresses() -> dict[int, tuple[str, int]]:
    """``{socket inode: (address, port)}`` of every listening TCP socket of this network
    namespace, from ``/proc/net/tcp`` and ``/proc/net/tcp6``."""
    found = {}
    for name, family in (("tcp", 4), ("tcp6", 6)):
        with open(f"/proc/net/{name}") as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                local, state, inode = fields[1], fields[3], int(fields[9])
                if state != LISTEN:
                    continue
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                if family == 4:
                    text = ".".join(str(b) for b in raw[::-1])
                else:  # four little-endian 32-bit words
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    import ipaddress

                    text = str(ipaddress.IPv6Address(words))
                found[inode] = (text, int(port, 16))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def listening() -> list[list[object]]:
    addresses = _addresses()
    out: list[list[object]] = []
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            command = " ".join(proc.cmdline())[:120]
            for inode in _socket_inodes(proc.pid):
                if inode in addresses:
                    address, port = addresses[inode]
                    out.append([address, port, proc.pid, command])
    return out


def echo(value: int) -> int:
    return value


def idle_workers() -> int:
    """Ray workers of this driver's Ray that run no task (their title is ``ray::IDLE``)."""
    count = 0
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            count += " ".join(proc.cmdline()).strip() == "ray::IDLE"
    return count


async def main() -> None:
    runner = RayRunner(address=None, prestart_workers=PRESTART)
    runner.connect()
    prestarted = idle_workers()
    try:
        job = await runner.submit_function(echo, 7)
        await asyncio.wait_for(job.wait(), 120)
        assert job.result() == 7, job.exception()
        # another runner of this process on that Ray: its tasks need no runtime environment
        # (each worker would start through Ray's setup_worker, a second interpreter)
        other = RayRunner(address=None)
        other.connect()
        plain = all("runtime_env" not in f._default_options for f in other._remote.values())
        await other.close()
        print(
            json.dumps({"prestarted": prestarted, "listening": listening(), "plain": plain}),
            flush=True,
        )
    finally:
        await runner.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
