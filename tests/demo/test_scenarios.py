"""`healthd demo` end to end, in process: every shipped scenario's expectations hold
(exit 0) on the real agents and controller over the API emulator; `--output json`
is the timeline of observed states; a wrong expectation exits 1 naming the step,
the expectation and what was seen; `--serve` keeps the cluster reachable."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from healthd.cli import main
from healthd.demo.command import play
from healthd.demo.scenario import (
    DEFAULT_SCENARIO,
    bundled_scenarios,
    load_scenario,
    parse_scenario,
)
from healthd.kube.client import Kube
from healthd.kube.objects import NODES
from tests.demo.playing import played

GPUHEALTH = "autopilot.ibm.com/gpuhealth"


def verdicts_seen(result: dict[str, Any], node: str) -> set[str | None]:
    return {entry["state"]["nodes"][node]["verdict"] for entry in result["timeline"]
            if entry["t"] >= 0}


def test_at_least_four_scenarios_ship() -> None:
    assert {"fault-tolerance", "remap-pending-drained", "mass-failure-breaker",
            "on-demand-bad-request"} <= set(bundled_scenarios())


@pytest.mark.parametrize("name", bundled_scenarios())
def test_every_shipped_scenario_passes(name: str) -> None:
    code, result = played(name)
    assert (code, result["failure"]) == (0, None)
    assert result["passed"] and result["steps_done"] == list(range(result["step_count"]))


def test_the_default_story_as_json() -> None:
    code, result = played(DEFAULT_SCENARIO)
    assert code == 0 and result["scenario"] == "fault-tolerance"
    states = [entry["state"] for entry in result["timeline"]]
    assert [e["t"] for e in result["timeline"]] == sorted(e["t"] for e in result["timeline"])
    # The fault stayed on its node: the other agents never left PASS.
    assert verdicts_seen(result, "gpu-node-1") == verdicts_seen(result, "gpu-node-3") == {"PASS"}
    assert "EVICT" in verdicts_seen(result, "gpu-node-2")
    limits = [s["lending"]["slack-cluster-queue"]["default-flavor/nvidia.com/gpu"]["limit"]
              for s in states]
    assert "0" in limits and limits[-1] is None
    assert states[-1]["appwrappers"]["blue/big-job"] == {
        "phase": "Running", "nodes": ["gpu-node-1", "gpu-node-3"]}
    assert any(e["reason"] == "NodeEvicted" and e["object"] == "big-job"
               for e in result["events"])


WRONG = """
name: wrong-expectation
appwrappers: [{namespace: blue, name: job, pods: 1, gpus_per_pod: 8}]
steps:
  - fault: {node: gpu-node-1, gpu: 0, xid: 79}
  - wait_for: {node: gpu-node-1, verdict: ERR, timeout: 3}
"""


def test_a_wrong_expectation_fails_naming_it(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "wrong.yaml"
    scenario.write_text(WRONG)
    code = main(["demo", "--scenario", str(scenario), "--nodes", "2"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "step 1 (wait_for): expected node gpu-node-1 verdict ERR within 3 s" in err
    assert "saw verdict EVICT" in err
    assert "FAILED: scenario wrong-expectation (1 of 2 steps)" in out


@pytest.mark.anyio
async def test_serve_keeps_the_cluster_reachable() -> None:
    scenario = parse_scenario({"name": "tiny", "nodes": 1, "steps": [
        {"wait_for": {"node": "gpu-node-1", "verdict": "PASS"}}]})
    seen: dict[str, Any] = {}

    async def look(cluster: Any) -> None:
        out = stream.getvalue()
        kubeconfig = next(ln.split()[-1] for ln in out.splitlines()
                          if ln.strip().startswith("kubeconfig"))
        async with await Kube.connect(kubeconfig) as kube:
            seen["label"] = (await kube.get(NODES, "gpu-node-1"))["metadata"]["labels"][GPUHEALTH]
        port = cluster.agent_ports()["gpu-node-1"]
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            seen["metrics"] = resp.status, await resp.text()

    stream = io.StringIO()
    result = await play(scenario, nodes=1, stream=stream, serve_port=0, hold=look)
    assert result["passed"]
    assert seen["label"] == "PASS"
    assert seen["metrics"][0] == 200 and "healthd_node_verdict" in seen["metrics"][1]
    assert "Ctrl-C stops it" in stream.getvalue()


def test_the_default_scenario_is_bundled() -> None:
    assert load_scenario().name == "fault-tolerance"
