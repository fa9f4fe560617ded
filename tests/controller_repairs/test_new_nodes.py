"""Validation of a node seen for the first time (`controller.repair.validate_new_nodes`):
the node is TESTING until its validation set passes, then PASS; off, it goes PASS on
its agent's word alone."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, NODE, eventually
from tests.controller.conftest import KubeFactory, controllers
from tests.controller_repairs.conftest import (
    REPAIR_NS,
    agent_lets_go,
    cluster,
    controller_config,
    gpu_node,
    gpu_uuid,
    labels_until_settled,
)

pytestmark = pytest.mark.anyio


def annotations(api: ApiEmulator) -> dict[str, str]:
    return dict(api.get("Node", NODE)["metadata"].get("annotations") or {})


async def test_a_new_node_is_testing_until_its_validation_passes(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    config = controller_config(validate_new_nodes=True)
    async with cluster(api, kube_for, tmp_path, spec="healthy-8xh100", config=config) as c:
        await eventually(lambda: "awaiting the validation of a new node" in (
            c.agent.condition() or {}).get("message", "") or c.repair() is not None, 15,
            "TESTING, saying why")
        seen = await labels_until_settled(c, lambda: c.repair() is not None and c.state() == ""
                                          and c.agent.verdict() == "PASS")
        assert [v for v in seen if v] == ["TESTING", "PASS"]  # never PASS before it passed
        assert await c.agent.parts.publisher.flush(10)  # the condition follows the label
        condition = c.agent.condition()
        assert condition is not None and condition["reason"] == "GPUsHealthy"
        last = c.agent.last_run()
        assert last is not None and last["id"] == "new-node" and last["accepted"]
        assert set(last["checks"].values()) <= {"PASS", "WARN", "SKIPPED"}
        doc = c.repair()
        assert doc is not None and doc["attempts"] == []  # no repair budget spent
        await eventually(lambda: c.events("RepairSucceeded"), 5, "the Event")
        assert len(c.events("NodeValidating")) == 1
        assert c.metric("healthd_controller_repairs_total", action="validate",
                        outcome="passed") == 1


async def test_without_the_option_a_new_node_goes_pass_directly(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path, spec="healthy-8xh100") as c:
        seen = await labels_until_settled(c, lambda: c.agent.verdict() == "PASS")
        await anyio.sleep(1.0)
        assert [v for v in seen if v] == ["PASS"] and c.agent.verdict() == "PASS"
        assert c.repair() is None and c.events("NodeValidating") == []
        assert c.repair_writes() == []


async def test_a_new_node_that_fails_its_validation_keeps_its_findings_and_is_repaired(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    """The agent's part played by the test: it answers the validation with a failed
    check and holds what it found, as the agent does."""
    api.seed(gpu_node())
    async with controllers(kube_for, controller_config(validate_new_nodes=True), "ctl") as (
            ctl,):
        await eventually(lambda: annotations(api).get(KEYS.run_id) == "new-node", 15,
                         "the validation asked for")
        assert KEYS.clear not in annotations(api)  # nothing to clear on a new node
        held = {"code": "REMAP_PENDING", "check": "remapped", "entity": "gpu3",
                "severity": "ERR", "sticky": False, "message": "", "uuid": gpu_uuid(3),
                "since": "2026-01-01T00:00:00Z"}
        answer = {"id": "new-node", "request": annotations(api)[KEYS.run], "kind": "run",
                  "accepted": True, "start": "2026-01-01T00:00:00Z",
                  "end": "2026-01-01T00:00:01Z", "verdict": "ERR",
                  "checks": {"remapped": "ERR"}}
        health = {"verdict": "ERR", "since": "2026-01-01T00:00:00Z", "top": "REMAP_PENDING",
                  "held": [held], "findings": [], "checks": {}}
        node = api.get("Node", NODE)
        node["metadata"]["annotations"].update({
            KEYS.last_run: json.dumps(answer), KEYS.health: json.dumps(health)})
        node["metadata"]["labels"][KEYS.gpuhealth] = "ERR"
        api.put(node)

        async with anyio.create_task_group() as group:
            group.start_soon(agent_lets_go, api)  # the reset waits for the agent's release
            await eventually(lambda: api.list("Job", REPAIR_NS), 15, "the repair goes on")
            group.cancel_scope.cancel()
        (failed,) = [e["message"] for e in api.list("Event") if e["reason"] == "RepairFailed"]
        assert "remapped ERR" in failed
        assert ctl.sample("healthd_controller_repairs_total",
                          {"action": "validate", "outcome": "failed"}) == 1
        doc = json.loads(annotations(api)[KEYS.repair])
        assert doc["state"] == "resetting" and [a["remedy"] for a in doc["attempts"]] == [
            "reset"]
