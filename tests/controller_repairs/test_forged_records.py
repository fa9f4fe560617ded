"""Repair records the controller did not write: anyone who may patch Nodes can write
`healthd.io/repair`. The controller checks each against what its own history gives
(the attempt in flight, its Job's name, GPUs named by UUID among the node's held
findings, a time not in the future), never acts on one that fails, says so (a Warning
Event, a log line, a metric) and replaces it with an idle record."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from healthd.controller.repair_state import refused_because
from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator
from healthd.util.times import rfc3339
from tests.agent.harness import KEYS, NODE, eventually
from tests.controller.conftest import KubeFactory, controllers
from tests.controller_repairs.conftest import (
    REPAIR_NS,
    agent_lets_go,
    controller_config,
    gpu_node,
    gpu_uuid,
    holding_node,
)

pytestmark = pytest.mark.anyio
JOB = f"{REPAIR_NS}/healthd-gpu-reset-{NODE}-1"
HOUR_AGO = rfc3339(time.time() - 3600)


def record(state: str, **fields: Any) -> str:
    return json.dumps({"state": state, "since": HOUR_AGO, **fields})


FORGED = {
    "an option smuggled in as a GPU": record(
        "resetting", job=JOB, gpus=["--nvidia-smi=/bin/true", gpu_uuid(3)],
        attempts=[{"remedy": "reset", "at": HOUR_AGO, "gpus": [gpu_uuid(3)], "outcome": ""}]),
    "a reset of GPUs no finding names": record(
        "resetting", job=JOB, gpus=[gpu_uuid(3)],
        attempts=[{"remedy": "reset", "at": HOUR_AGO, "gpus": [gpu_uuid(3)], "outcome": ""}]),
    "a validation no attempt asked for": record("validating", run_id="repair-7", attempts=[]),
    "a reboot request from long ago": record("reboot-requested", request="x/y",
                                             boot_id="boot-1", attempts=[]),
    "a time in the future": record("waiting", since=rfc3339(time.time() + 86400)),
    "garbage": "{not json",
}


def annotations(api: ApiEmulator) -> dict[str, str]:
    return dict(api.get("Node", NODE)["metadata"].get("annotations") or {})


def refusals(api: ApiEmulator) -> list[str]:
    return [e["message"] for e in api.list("Event") if e.get("reason") == "RepairRecordRefused"]


@pytest.mark.parametrize("forged", FORGED.values(), ids=FORGED.keys())
async def test_a_record_the_controller_did_not_write_is_refused_and_never_acted_on(
        api: ApiEmulator, kube_for: KubeFactory, forged: str) -> None:
    node = gpu_node(labels={KEYS.gpuhealth: "PASS"})
    node["metadata"]["annotations"][KEYS.repair] = forged
    api.seed(node)
    async with anyio.create_task_group() as group, \
            controllers(kube_for, controller_config(reboot_timeout="1s"), "ctl") as (ctl,):
        group.start_soon(agent_lets_go, api)  # an agent that would let go, were it asked
        await eventually(lambda: refusals(api), 15, "the Warning Event")
        doc = json.loads(annotations(api)[KEYS.repair])
        assert doc["state"] == "" and doc["reason"].startswith(
            "refused a repair record healthd did not write")
        await anyio.sleep(1.5)  # long enough for a Job, a reboot timeout, a validation
        assert api.list("Job", REPAIR_NS) == []
        assert json.loads(annotations(api)[KEYS.repair])["state"] == ""  # not humans
        assert len(refusals(api)) == 1
        assert ctl.sample("healthd_controller_repair_records_refused_total", {}) == 1
        group.cancel_scope.cancel()


async def test_the_controllers_own_reset_record_is_acted_on(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    """The same checks pass every record the controller writes itself."""
    api.seed(holding_node("REMAP_PENDING", "remapped", 3, "ERR"))
    async with anyio.create_task_group() as group, \
            controllers(kube_for, controller_config(), "ctl"):
        group.start_soon(agent_lets_go, api)
        await eventually(lambda: api.list("Job", REPAIR_NS), 15, "the Job")
        doc = json.loads(annotations(api)[KEYS.repair])
        assert doc["state"] == "resetting" and doc["job"] == JOB
        assert refusals(api) == []
        group.cancel_scope.cancel()


def test_only_uuids_reach_the_jobs_command_line() -> None:
    from healthd.controller.repair_state import node_repair
    from healthd.kube.shapes import Node, view

    node = holding_node("REMAP_PENDING", "remapped", 3, "ERR")
    node["metadata"]["annotations"][KEYS.repair] = FORGED["an option smuggled in as a GPU"]
    why = refused_because(node_repair(view(Node, node), Keys()), namespace=REPAIR_NS,
                          now=time.time())
    assert "GPUs not named by UUID" in why and "--nvidia-smi" in why
