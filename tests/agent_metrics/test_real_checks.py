"""The metrics of real check results: the NVML and pciebw checks run on a simulated
machine, and their values land in the families (value names must match the checks')."""

from __future__ import annotations

import anyio
from prometheus_client import CollectorRegistry

from checks.base import CheckResult
from checks.snapshot import NvmlGpuSource
from healthd.agent.metrics import AgentMetrics
from healthd.check.once import run_planned
from healthd.check.plans import planned_check
from healthd.config import load_config
from healthd.sim.node import simulate

CHECKS = ["remapped", "pciebw", "power", "pcie", "ecc"]


def run_on(machine: str) -> list[CheckResult]:
    config = load_config(None, env={})

    async def main() -> list[CheckResult]:
        with simulate(machine) as sim:
            probes = sim.check_probes()
            planned = sim.prepare([planned_check(config, name, probes=probes)
                                   for name in CHECKS])
            ctx = sim.check_context(config, gpus := NvmlGpuSource())
            try:
                return await run_planned(planned, ctx)
            finally:
                await gpus.aclose()

    return anyio.run(main)


def observed(machine: str) -> tuple[CollectorRegistry, list[CheckResult]]:
    """A registry fed one round of CHECKS on `machine`, and the results."""
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry, node="n1", cpu_model="cpu", gpu_model="gpu")
    results = run_on(machine)
    for key, result in zip(CHECKS, results, strict=True):
        metrics.observe_result(key, result)
    return registry, results


def gpu_labels(results: list[CheckResult], index: int) -> dict[str, str]:
    """GPU `index`'s dcgm-exporter labels, from the identity the checks report."""
    gpu = next(s.entity for s in results[0].entities if s.entity.index == index)
    assert gpu.uuid and gpu.pci_bus_id and gpu.model
    return {"node": "n1", "gpu": str(index), "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id,
            "modelName": gpu.model}


def autopilot(registry: CollectorRegistry, health: str, deviceid: str) -> float | None:
    labels = {"health": health, "node": "n1", "deviceid": deviceid, "cpumodel": "cpu",
              "gpumodel": "gpu"}
    return registry.get_sample_value("autopilot_health_checks", labels)


def test_slow_pcie_gpu_shows_its_bandwidth() -> None:
    registry, results = observed("pcie-bw-low")
    gpu4 = gpu_labels(results, 4)
    assert autopilot(registry, "pciebw", "4") == 9.0
    fast = autopilot(registry, "pciebw", "0")
    assert fast is not None and fast > 40
    d2h = {**gpu4, "direction": "d2h"}
    assert registry.get_sample_value("healthd_gpu_pcie_bandwidth_gbps", d2h) == 9.0
    link = registry.get_sample_value("healthd_gpu_pcie_link_bandwidth_gbps", gpu4)
    assert link is not None and link > 60
    width = registry.get_sample_value("healthd_gpu_pcie_link_width", {**gpu4, "link": "current"})
    assert width == 16
    status = {**gpu4, "check": "pciebw", "entity": "gpu4", "status": "WARN"}
    assert registry.get_sample_value("healthd_check_entity_status", status) == 1


def test_pending_remap_shows_on_its_gpu_only() -> None:
    registry, results = observed("remap-pending")
    assert autopilot(registry, "remapped", "3") == 1
    assert autopilot(registry, "remapped", "0") == 0
    assert autopilot(registry, "power-slowdown", "3") == 0
    rows = {**gpu_labels(results, 3), "kind": "uncorrectable"}
    assert registry.get_sample_value("healthd_gpu_remapped_rows", rows) == 1
    assert registry.get_sample_value("healthd_gpu_row_remap_pending", gpu_labels(results, 3)) == 1
    power = registry.get_sample_value("healthd_gpu_power_watts", gpu_labels(results, 0))
    assert power is not None and power > 0

