"""What a Ray child of ``submit_function`` runs in its node pool's worker.

A module of its own, light to import: every node pool's launcher preloads it (the workers
unpickle ``run_payload`` by reference), and it must not bring the host side of a pool
(``_ray_node``: the pool, its inboxes, asyncio) into every launcher and worker.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_payload"]


def run_payload(payload: bytes) -> Any:
    """Run in the pool's worker: the function, arguments and keywords pickled by the driver.

    The Ray worker passes the bytes on without unpickling them, so no module of the child's
    is ever imported into the long-lived Ray worker.
    """
    import cloudpickle

    fn, args, kwargs = cloudpickle.loads(payload)
    return fn(*args, **kwargs)
