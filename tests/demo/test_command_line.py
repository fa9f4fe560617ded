"""`healthd demo` as a user meets it: node counts on the command line, and the
`--serve` cluster seen through the fleet tools run as processes (`healthd status`
shows the agents' Pods ready; `healthd trigger --checks dcgm:3` runs the deep
diagnostic as a Job that the demo's kubelet stand-in runs, and answers)."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.demo.command import play
from healthd.demo.scenario import load_scenario, parse_scenario

HEALTHD = [sys.executable, "-m", "healthd.cli"]


def test_ten_nodes_play_the_default_story() -> None:
    # Placement used to be first fit in string order: gpu-node-10 before gpu-node-2.
    proc = subprocess.run([*HEALTHD, "demo", "--nodes", "10", "-o", "json"],
                          capture_output=True, text=True, timeout=180)
    result = json.loads(proc.stdout)
    assert (proc.returncode, result["failure"]) == (0, None)
    assert result["nodes"] == 10


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes", "0"], "--nodes 0: scenario fault-tolerance plays on 3 to 64 GPU nodes"),
    (["--nodes", "65"], "--nodes 65: scenario fault-tolerance plays on 3 to 64 GPU nodes"),
    # The default story names gpu-node-1 and gpu-node-2 but needs a third node for its
    # job to move to: 1 used to exit 78 naming gpu-node-2, 2 to fail after 22 s.
    (["--nodes", "1"], "--nodes 1: scenario fault-tolerance plays on 3 to 64 GPU nodes "
                       "(its min_nodes: 3)"),
    (["--nodes", "2"], "--nodes 2: scenario fault-tolerance plays on 3 to 64 GPU nodes"),
    (["--scenario", "mass-failure-breaker", "--nodes", "2"],
     "--nodes 2: scenario mass-failure-breaker plays on 3 to 64 GPU nodes (its steps name "
     "gpu-node-3)"),
])
def test_a_node_count_the_scenario_cannot_play_on_is_a_usage_error(
        argv: list[str], message: str) -> None:
    proc = subprocess.run([*HEALTHD, "demo", *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 64
    assert proc.stdout == ""  # refused before any cluster starts
    assert proc.stderr.startswith("usage: healthd demo"), proc.stderr
    assert f"healthd: {message}" in proc.stderr


def test_a_scenario_whose_own_count_is_below_its_minimum_cannot_be_played(
        tmp_path: Path) -> None:
    story = tmp_path / "story.yaml"
    story.write_text("name: tight\nnodes: 2\nmin_nodes: 3\n"
                     "steps: [{wait_for: {node: gpu-node-1, verdict: PASS}}]\n")
    proc = subprocess.run([*HEALTHD, "demo", "--scenario", str(story)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 78
    assert "min_nodes (3) cannot exceed nodes (2)" in proc.stderr


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


README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.anyio
async def test_the_served_default_storys_diagnose_hint_works_as_the_readme_says() -> None:
    # At the end of the default story big-job holds gpu-node-1 and gpu-node-3: a deep
    # diagnostic there is refused (GPUs busy). The hint must name a node it runs on.
    seen: dict[str, Any] = {}

    async def look(cluster: Any) -> None:
        hint = next(ln.split(None, 1)[1] for ln in stream.getvalue().splitlines()
                    if ln.strip().startswith("diagnose"))
        argv = shlex.split(hint)
        assert argv[:2] == ["healthd", "trigger"], hint
        seen["hint"] = argv
        with anyio.fail_after(120):
            seen["run"] = await _healthd(*argv[1:], "--timeout", "90s", "-o", "json")

    stream = io.StringIO()
    result = await play(load_scenario(), nodes=3, stream=stream, serve_port=0, hold=look)
    assert result["passed"], result["failure"]
    node = seen["hint"][seen["hint"].index("--nodes") + 1]
    run = seen["run"]
    assert run.returncode == 0, run.stdout.decode() + run.stderr.decode()
    [answer] = json.loads(run.stdout)["nodes"]
    assert (answer["node"], answer["checks"]) == (node, {"dcgm:3": "PASS"})

    documented = re.search(r"healthd trigger --kubeconfig /tmp/healthd-demo-XXXX/kubeconfig "
                           r"--nodes (\S+) --checks dcgm:3 --wait", README)
    assert documented is not None and documented[1] == node
