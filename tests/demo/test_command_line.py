"""`healthd demo` as a user meets it: node counts on the command line, and the
`--serve` cluster seen through the fleet tools run as processes (`healthd status`
shows the agents' Pods ready; `healthd trigger --checks dcgm:3` runs the deep
diagnostic as a Job that the demo's kubelet stand-in runs, and answers)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import anyio
import pytest

from healthd.demo.command import play
from healthd.demo.scenario import parse_scenario

HEALTHD = [sys.executable, "-m", "healthd.cli"]


def test_ten_nodes_play_the_default_story() -> None:
    # Placement used to be first fit in string order: gpu-node-10 before gpu-node-2.
    proc = subprocess.run([*HEALTHD, "demo", "--nodes", "10", "-o", "json"],
                          capture_output=True, text=True, timeout=180)
    result = json.loads(proc.stdout)
    assert (proc.returncode, result["failure"]) == (0, None)
    assert result["nodes"] == 10


@pytest.mark.parametrize("count", ["0", "-1", "65"])
def test_a_node_count_out_of_range_is_a_usage_error(count: str) -> None:
    proc = subprocess.run([*HEALTHD, "demo", "--nodes", count], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 64
    assert proc.stdout == ""
    assert proc.stderr.strip() == (f"healthd: --nodes {count}: the demo cluster has 1 to 64 "
                                   "GPU nodes")


async def _healthd(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process([*HEALTHD, *argv], check=False)


@pytest.mark.anyio
async def test_served_cluster_shows_ready_agents_and_runs_deep_diagnostics() -> None:
    scenario = parse_scenario({"name": "two", "nodes": 2, "steps": [
        {"wait_for": {"node": "gpu-node-2", "verdict": "PASS"}}]})
    seen: dict[str, Any] = {}

    async def look(cluster: Any) -> None:
        kubeconfig = next(ln.split()[-1] for ln in stream.getvalue().splitlines()
                          if ln.strip().startswith("kubeconfig"))
        with anyio.fail_after(30):
            while not all(agent.ready()[0] for agent in cluster.agents.values()):
                await anyio.sleep(0.2)
        await anyio.sleep(1.5)  # one readiness probe period
        seen["status"] = await _healthd("status", "-o", "json", "--kubeconfig", kubeconfig)
        seen["table"] = await _healthd("status", "--kubeconfig", kubeconfig)
        seen["trigger"] = await _healthd("trigger", "--nodes", "gpu-node-2", "--checks",
                                         "dcgm:3", "--wait", "--timeout", "90s", "-o", "json",
                                         "--kubeconfig", kubeconfig)

    stream = io.StringIO()
    result = await play(scenario, nodes=2, stream=stream, serve_port=0, hold=look)
    assert result["passed"]

    status = json.loads(seen["status"].stdout)
    assert [(r["name"], r["agent"], r["agent_ready"]) for r in status["nodes"]] == [
        ("gpu-node-1", True, True), ("gpu-node-2", True, True)]
    table = seen["table"].stdout.decode()
    assert "2 GPU nodes: 2 PASS" in table and " NONE " not in table

    trigger = seen["trigger"]
    assert trigger.returncode == 0, trigger.stderr.decode()
    [node] = json.loads(trigger.stdout)["nodes"]
    assert node["checks"] == {"dcgm:3": "PASS"}
    assert node["reasons"] == {}
