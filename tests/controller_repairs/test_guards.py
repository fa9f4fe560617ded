"""What keeps the repair's hands off: the reset breaker, and hardware inspection
until an admin clears the node."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, eventually
from tests.controller.conftest import KubeFactory
from tests.controller.conftest import node as other_node
from tests.controller_repairs.conftest import cluster

pytestmark = pytest.mark.anyio


async def test_an_open_breaker_holds_the_repair_and_says_so(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    # Three of three GPU nodes bad: a mass failure, not a GPU one.
    api.seed(other_node("gpu-node-2", "ERR"), other_node("gpu-node-3", "ERR"))
    async with cluster(api, kube_for, tmp_path) as c:
        await eventually(lambda: c.state() == "held", 15, "held")
        doc = c.repair()
        assert doc is not None and "breaker is open" in doc["reason"]
        await eventually(lambda: c.events("RepairHeld"), 5, "the Event")
        await anyio.sleep(1.0)
        assert c.jobs() == []


async def test_hardware_inspection_is_sticky_until_an_admin_clears_the_node(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path, spec="remap-failure") as c:
        await eventually(lambda: c.state() == "hardware-inspection", 15, "to humans")
        await eventually(lambda: c.events("HardwareInspection"), 5, "the Event")
        await eventually(lambda: c.metric("healthd_controller_nodes_in_hardware_inspection")
                         == 1, 5, "the gauge")  # from the node as the watch brings it back
        await anyio.sleep(1.0)
        assert c.jobs() == [] and len(c.repair_writes()) == 1
        assert c.agent.verdict() == "EVICT"  # kept out

        # The admin replaces the GPU, then clears the node.
        control = tmp_path / "machine.control"
        with control.open("a") as handle:
            handle.write(json.dumps({"op": "clear_faults"}) + "\n")
        await anyio.sleep(0.5)
        c.agent.annotate(**{KEYS.clear: "true"})

        await eventually(lambda: c.state() == "" and c.agent.verdict() == "PASS", 15,
                         "back in service")
        await eventually(lambda: c.events("HardwareInspectionCleared"), 5, "the Event")
        await eventually(lambda: c.metric("healthd_controller_nodes_in_hardware_inspection")
                         == 0, 5, "the gauge")
        assert len(c.events("HardwareInspection")) == 1
        assert c.jobs() == []
