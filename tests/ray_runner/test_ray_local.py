"""The Ray that ``RayRunner(address=None)`` starts listens on loopback only.

A driver of its own (``_local_driver.py``) starts that Ray, runs a child there (so a worker
runs too) and lists every listening TCP socket of the Ray's processes, read from
``/proc/net/tcp``, ``/proc/net/tcp6`` and each process's ``/proc/PID/fd``."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _ray_testing import BOUND

pytestmark = pytest.mark.ray

HERE = Path(__file__).parent


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_a_local_ray_listens_on_loopback_only_and_prestarts_its_workers() -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        # what the tests' cluster sets for itself: the runner must get there on its own
        if key not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ENABLE_UV_RUN_RUNTIME_ENV")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent)])
    done = subprocess.run(
        [sys.executable, str(HERE / "_local_driver.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=4 * BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    sockets = said["listening"]
    assert len(sockets) >= 3, sockets  # the GCS, the raylet, a worker at least
    wide = [entry for entry in sockets if not loopback(entry[0])]
    assert wide == [], f"{len(wide)} of {len(sockets)} listen beyond loopback: {wide}"
    # prestart_workers: the workers were running when connect() returned
    assert said["prestarted"] >= 4, said["prestarted"]
    assert said["plain"]  # a second runner on that Ray asks for no runtime environment
