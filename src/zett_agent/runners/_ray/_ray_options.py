"""``RayRunner``'s options: their checks, and what they ask of ``ray.init``.

Imported with ``RayRunner`` (it imports Ray's constants only when a local Ray starts).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from zett_agent._checks import check_number, described

__all__ = ["check_placement", "check_resources", "init_arguments", "local_ray"]

_PLACEMENT_KEYS = frozenset({"num_cpus", "resources"})


def init_arguments(
    address: str | None, extra: Mapping[str, Any], prestart_workers: int
) -> dict[str, Any]:
    """The ``ray.init`` arguments of a runner that connects to ``address``.

    ``None`` starts a new local Ray: on 127.0.0.1 (see ``local_ray``), without its dashboard,
    with the workers' children left to their pools' launchers (which kill them when their
    worker dies), and ``prestart_workers`` Python workers kept while idle (the runner starts
    them right after ``ray.init``). ``extra`` (the runner's ``init_kwargs``) wins over all.
    """
    kwargs: dict[str, Any] = {"address": address, "log_to_driver": False}
    if address is not None:
        kwargs.update(extra)
        return kwargs
    kwargs.update(
        # a new local Ray, never one that happens to run on this machine already
        address="local",
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
    )
    kwargs.update(extra)
    system: dict[str, Any] = {"kill_child_processes_on_worker_exit": False}
    if prestart_workers:
        # the raylet keeps this many workers while they idle (by default one per CPU, ending
        # the others after a second), and may start as many at once (default: one per CPU)
        system.update(
            num_workers_soft_limit=prestart_workers,
            worker_maximum_startup_concurrency=prestart_workers,
        )
    kwargs["_system_config"] = {**system, **kwargs.get("_system_config", {})}
    return kwargs


@contextlib.contextmanager
def local_ray(local: bool) -> Iterator[None]:
    """Keep a local Ray on loopback and its workers in this environment while it starts.

    While a local Ray starts: every process of it on 127.0.0.1, and its workers in this environment.

    Ray replaces 127.0.0.1 by the machine's address unless it thinks it runs on a desktop OS
    (``ray_constants.ENABLE_RAY_CLUSTER``, read at import), and with the machine's address
    its GCS, raylet, workers and agents listen on every interface. Under ``uv run``, Ray
    packages the working directory and starts every worker through ``uv run``
    (``RAY_ENABLE_UV_RUN_RUNTIME_ENV``): a local Ray's workers already run in this very
    environment, so that is off too, unless the variable was set explicitly.
    """
    if not local:
        yield
        return
    from ray._private import ray_constants

    saved = {
        name: getattr(ray_constants, name, None)
        for name in ("ENABLE_RAY_CLUSTER", "RAY_ENABLE_UV_RUN_RUNTIME_ENV")
    }
    ray_constants.ENABLE_RAY_CLUSTER = False
    if "RAY_ENABLE_UV_RUN_RUNTIME_ENV" not in os.environ:
        ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(ray_constants, name, value)


def check_resources(where: str, resources: Mapping[str, float]) -> dict[str, float]:
    if not isinstance(resources, Mapping):
        raise TypeError(f"{where} must map resource names to amounts, got {described(resources)}")
    out = {}
    for name, amount in resources.items():
        if not isinstance(name, str):
            raise TypeError(f"{where} must map resource names (str) to amounts, got {name!r:.40}")
        out[name] = check_number(f"{where}[{name!r}]", amount)
    return out


def check_placement(name: object, options: Mapping[str, Any]) -> dict[str, Any]:
    where = f"placement[{name!r:.40}]"
    if not isinstance(name, str) or not isinstance(options, Mapping):
        raise TypeError(f"placement maps definition names to option dicts; {where} is not one")
    unknown = set(options) - _PLACEMENT_KEYS
    if unknown:
        raise ValueError(
            f"{where} has unknown options {sorted(unknown)}; it takes num_cpus and resources"
        )
    out: dict[str, Any] = {}
    if "num_cpus" in options:
        value = options["num_cpus"]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{where}['num_cpus'] must be a number >= 0, got {value!r:.40}")
        out["num_cpus"] = float(value)
    if "resources" in options:
        out["resources"] = check_resources(f"{where}['resources']", options["resources"])
    return out
