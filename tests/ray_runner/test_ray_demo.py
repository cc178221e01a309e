"""``zett-agent demo --ray ADDRESS`` and the README's Ray example: their children on the test
cluster, read as a user would (the demo through ``--json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.scripts import zett_agent

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "_examples" / "ray_children.py"

HANG_GUARD = 120


def launchers(ray_cluster: dict[str, Any]) -> list[int]:
    """The pools alive on the cluster before a driver of a test's own starts."""
    return list(ray_cluster["host"].call("launchers")["launchers"])


def assert_cluster_clean(ray_cluster: dict[str, Any], before: list[int]) -> None:
    """The driver ran in a process of its own: once it exits, the raylet ends its Ray workers,
    and each worker's pool goes with it, on the cluster's schedule rather than the driver's.
    Wait (bounded) until the cluster holds nothing of it (no pool but those alive ``before``
    it started), and say what was left if it does."""
    left = ray_cluster["host"].call("wait_clean", within=HANG_GUARD / 4, launchers=before)
    assert not (left["leftovers"] or left["cgroups"] or left["launchers"]), left


@pytest.mark.ray
def test_the_demo_runs_its_children_on_ray_and_names_their_nodes(
    ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    for i in range(6):
        (tmp_path / f"file{i}.txt").write_text(f"content {i}\n" * 100)
    address = ray_cluster["address"]
    before = launchers(ray_cluster)
    done = zett_agent(
        "demo", str(tmp_path), "--ray", address, "--json", "--rounds", "500", "--hashers", "2"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_cluster_clean(ray_cluster, before)
    result = json.loads(done.stdout)  # stdout is the JSON alone (Ray's own lines go to stderr)
    tasks = {t["subagent_type"]: t for t in result["tasks"]}
    assert {t["status"] for t in result["tasks"] if t["subagent_type"] == "hasher"} == {"completed"}
    assert result["files_hashed"] == 6
    assert tasks["spinner"]["status"] == "cancelled"
    assert tasks["crasher"]["status"] == "failed" and "SIGSEGV" in tasks["crasher"]["error"]
    nodes = set(ray_cluster["nodes"].values())
    assert all(t["node_id"] in nodes for t in result["tasks"]), result["tasks"]


def test_a_folder_given_as_the_ray_address_is_refused_with_the_fix(tmp_path: Path) -> None:
    done = zett_agent("demo", "--ray", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"zett-agent demo: --ray got {str(tmp_path)!r}, which is a folder: put the folder "
        f"first (zett-agent demo {tmp_path} --ray) or give an address (--ray auto)"
    ]


@pytest.mark.ray
def test_the_readme_example_runs_its_children_on_the_cluster(ray_cluster: dict[str, Any]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    before = launchers(ray_cluster)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), ray_cluster["address"]],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_cluster_clean(ray_cluster, before)
    nodes = {node[:12] for node in ray_cluster["nodes"].values()}
    lines = done.stdout.strip().splitlines()
    assert [line.split(" (on node ")[0] for line in lines] == [
        "auth: 3 entry points",
        "billing: 3 entry points",
    ]
    assert all(line.split(" (on node ")[1].rstrip(")") in nodes for line in lines), lines
