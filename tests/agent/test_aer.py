"""PCIe AER on a running agent: a fatal error on a GPU's root port, counted while the
agent runs, turns the node EVICT on the next aer run (the runs before it took the
baseline and found nothing), and the counters are gauges."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import AerFault, GpuFault, parse_machine_spec
from tests.agent.harness import (
    NODE,
    ROUND_S,
    eventually,
    fast_config,
    running_agent,
    with_intervals,
)

pytestmark = pytest.mark.anyio


async def test_a_fatal_error_above_a_gpu_makes_the_node_evict(
        api: ApiEmulator, tmp_path: Path) -> None:
    spec = parse_machine_spec({"node": NODE})
    config = with_intervals(fast_config(), aer=ROUND_S)
    async with running_agent(api, tmp_path, spec=spec, config=config) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label before the error")
        h.sim.nvml.inject(GpuFault(gpu=3, aer=[AerFault(level=3, fatal={"SDES": 1})]))
        await eventually(lambda: h.verdict() == "EVICT", what="EVICT label")
        assert await h.parts.publisher.flush(10)  # the condition goes out after the label
        condition = h.condition()
        assert condition is not None and condition["reason"] == "PCIE_AER_FATAL"
        gpu3 = {"node": NODE, "gpu": "3", "UUID": spec.uuid(3),
                "pci_bus_id": spec.pci_bus_id(3), "modelName": spec.gpus.model}
        assert h.metric("healthd_gpu_pcie_aer_errors", **gpu3, kind="fatal",
                        where="upstream") == 1
        assert h.metric("healthd_gpu_pcie_aer_errors", **gpu3, kind="fatal", where="gpu") == 0
