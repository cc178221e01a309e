"""What a Ray child's task yields: what its node queued at once travels as one stream item, and
a usage report only when the numbers changed.

Each item a Ray generator yields costs the task about half a millisecond and reaches the driver
after the ones before it, so the task joins what it has (records and frames) into one list
item, within ``RELAY_CHUNK`` bytes, in order. The driver side of it runs in every Ray test.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from zett_agent.process import JobUsage, ProcessLimits
from zett_agent.runners._ray._ray_node import NodeConfig, NodeRun
from zett_agent.runners._ray._ray_task import RELAY_CHUNK, _joined


def _flat(items: list[object]) -> list[object]:
    out: list[object] = []
    for item in items:
        out.extend(item if isinstance(item, list) else [item])
    return out


def test_what_was_queued_at_once_is_one_item_in_order() -> None:
    parts: list[str | bytes] = ['{"k":"inbox"}', '{"k":"pid","pid":7}', b"\0\0\0\x02ab"]
    assert list(_joined(parts)) == [parts]


def test_a_lone_part_is_itself_and_nothing_is_no_item() -> None:
    assert list(_joined(['{"k":"end"}'])) == ['{"k":"end"}']
    assert list(_joined([b"frames"])) == [b"frames"]
    assert list(_joined([])) == []


def test_items_stay_within_the_relay_chunk_and_keep_the_order() -> None:
    big = b"x" * (RELAY_CHUNK - 10)
    parts: list[str | bytes] = ['{"k":"pid"}', big, b"y" * 20, '{"k":"end"}', b"z" * RELAY_CHUNK]
    items = list(_joined(parts))
    assert _flat(items) == parts
    # the record and the big frames would be one byte over: each alone
    assert items == ['{"k":"pid"}', big, [b"y" * 20, '{"k":"end"}'], b"z" * RELAY_CHUNK]
    for item in items:
        size = sum(len(p) for p in item) if isinstance(item, list) else len(item)
        assert size <= RELAY_CHUNK


class _Job:
    """What ``NodeRun``'s usage timer reads of a job: its numbers, and whether it ended."""

    def __init__(self) -> None:
        self.cpu = 0.5
        self.pid = None
        self.sandbox_report = None

    def done(self) -> bool:
        return False

    def usage(self) -> JobUsage:
        return JobUsage(
            cpu_seconds=self.cpu, rss_bytes=1 << 20, peak_rss_bytes=1 << 20, elapsed=1.0
        )


async def test_a_waiting_child_sends_usage_only_when_it_changed() -> None:
    """A child waiting on its model uses nothing: each report would be a Ray item for its task to
    yield and the driver to read, every second, for nothing."""
    host = SimpleNamespace(loop=asyncio.get_running_loop())
    run = NodeRun(host, NodeConfig(), b"", ProcessLimits(), None, None, False)  # type: ignore[arg-type]
    job = _Job()
    try:
        for _ in range(3):
            run._usage(job)  # type: ignore[arg-type]
        job.cpu = 0.75
        run._usage(job)  # type: ignore[arg-type]
        reports = [item[1] for item in run._items if item[0] == "usage"]
        assert reports == [{"cpu": 0.5, "rss": 1 << 20}, {"cpu": 0.75, "rss": 1 << 20}]
    finally:
        if run._usage_timer is not None:
            run._usage_timer.cancel()
        run.close()
        run._release()
