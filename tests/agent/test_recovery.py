"""The driver's recovery action on a running agent: a GPU whose driver asks for a node
reboot turns the node EVICT on the first round that reads it, names the code in the
condition, and the action is a metric label remediation can read."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import parse_machine_spec
from tests.agent.harness import (
    NODE,
    ROUND_S,
    eventually,
    fast_config,
    running_agent,
    with_intervals,
)

pytestmark = pytest.mark.anyio


async def test_a_gpu_whose_driver_asks_for_a_reboot_makes_the_node_evict(
        api: ApiEmulator, tmp_path: Path) -> None:
    spec = parse_machine_spec({"node": NODE, "faults": [
        {"gpu": 5, "recovery_action": "NODE_REBOOT"}]})
    config = with_intervals(fast_config(), recovery=ROUND_S)
    async with running_agent(api, tmp_path, spec=spec, config=config) as h:
        await eventually(lambda: h.verdict() == "EVICT", what="EVICT label")
        assert await h.parts.publisher.flush(10)  # the condition goes out after the label
        condition = h.condition()
        assert condition is not None and condition["reason"] == "RECOVERY_NODE_REBOOT"
        assert h.metric("healthd_check_runs_total", node=NODE, check="recovery",
                        result="EVICT") == 1  # raised by the first run that read it
        gpu5 = {"node": NODE, "gpu": "5", "UUID": spec.uuid(5),
                "pci_bus_id": spec.pci_bus_id(5), "modelName": spec.gpus.model}
        assert h.metric("healthd_gpu_recovery_action", **gpu5, action="NODE_REBOOT") == 2
        gpu0 = {**gpu5, "gpu": "0", "UUID": spec.uuid(0), "pci_bus_id": spec.pci_bus_id(0)}
        assert h.metric("healthd_gpu_recovery_action", **gpu0, action="NONE") == 0
