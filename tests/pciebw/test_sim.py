"""The simulated probe from machine specs: healthy defaults at 85% of the current
link, spec-wide and per-fault bandwidth, faults that come and go, link faults,
lost/missing GPUs and an absent driver; and the check end to end on simulated
machines (the real NVML reader over the fake NVML library, the simulated probe),
including the bundled `pcie-bw-low` example."""

from __future__ import annotations

import pytest

from checks.base import CheckResult, Severity
from checks.nvml_reader import NvmlReader
from checks.pciebw import PcieBwCheck
from checks.pciebw_probe import ProbeError, ProbeUnavailable
from checks.probes import Probes
from checks.snapshot import NodeSnapshot
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.fakenvml import install
from healthd.sim.machine import (
    GpuFault,
    MachineSpec,
    load_machine_spec,
    parse_machine_spec,
)
from tests.checks.gpufakes import codes_by_gpu, context, entity_status, run

MIB = 1 << 20


def spec(faults: list[dict[str, object]] | None = None, **gpus: object) -> MachineSpec:
    defaults: dict[str, object] = {"count": 4, **gpus}
    return parse_machine_spec({"gpus": defaults, "faults": faults or []})


def measure(machine: MachineSpec, index: int, t: float = 0.0) -> tuple[float, float]:
    got = SimBandwidthProbe(machine, clock=lambda: t).rates(
        machine.pci_bus_id(index), 256 * MIB, 5
    )
    return round(got.h2d_gbps, 2), round(got.d2h_gbps, 2)


def read_snapshot(machine: MachineSpec, t: float = 0.0) -> NodeSnapshot:
    """What the real NVML reader sees on the simulated machine at `t`."""
    with install(machine, clock=lambda: t):
        reader = NvmlReader()
        try:
            return reader.read()
        finally:
            reader.close()


async def judge_machine(machine: MachineSpec, t: float = 0.0) -> CheckResult:
    probe = SimBandwidthProbe(machine, clock=lambda: t)
    check = PcieBwCheck(probes=Probes(bandwidth=probe))
    return await run(check, context(read_snapshot(machine, t)))


def test_healthy_gpu_measures_85_percent_of_its_link() -> None:
    assert measure(spec(), 0) == (53.56, 53.56)  # 0.85 x 63.02


def test_spec_wide_and_per_fault_bandwidth_direction_by_direction() -> None:
    machine = spec(
        [{"gpu": 2, "pcie_bandwidth_gbps": {"d2h": 7.0}}],
        pcie_bandwidth_gbps={"h2d": 40.0},
    )
    assert measure(machine, 0) == (40.0, 53.56)
    assert measure(machine, 2) == (40.0, 7.0)


def test_fault_applies_only_between_at_and_until() -> None:
    machine = spec([{"gpu": 1, "at": 10, "until": 20, "pcie_bandwidth_gbps": {"h2d": 5.0}}])
    assert [measure(machine, 1, t)[0] for t in (5, 10, 19.9, 20)] == [53.56, 5.0, 5.0, 53.56]


def test_link_fault_lowers_what_a_healthy_gpu_measures() -> None:
    machine = spec([{"gpu": 3, "pcie": {"gen": 3, "width": 8}}])
    assert measure(machine, 3) == (6.7, 6.7)  # 0.85 x Gen3 x8 (7.88)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"lost": True}, "CUDA_ERROR_UNKNOWN"),
        ({"missing": True}, "no CUDA device"),
    ],
)
def test_lost_or_missing_gpu_is_a_probe_error(fault: dict[str, object], message: str) -> None:
    with pytest.raises(ProbeError, match=message):
        measure(spec([{"gpu": 0, **fault}]), 0)


def test_faults_can_come_from_a_live_source() -> None:
    machine = spec()
    injected = [GpuFault.model_validate({"gpu": 2, "pcie_bandwidth_gbps": {"h2d": 3.0}})]
    probe = SimBandwidthProbe(machine, lambda: 0.0, faults=lambda i: injected if i == 2 else [])
    assert probe.rates(machine.pci_bus_id(2), MIB, 1).h2d_gbps == 3.0


def test_unknown_bus_id_and_absent_driver() -> None:
    probe = SimBandwidthProbe(spec())
    with pytest.raises(ProbeError, match="no CUDA device"):
        probe.rates("00000000:FF:00.0", MIB, 1)
    absent = SimBandwidthProbe(parse_machine_spec({"driver_present": False}))
    with pytest.raises(ProbeUnavailable, match="CUDA driver not found"):
        absent.rates(spec().pci_bus_id(0), MIB, 1)


@pytest.mark.anyio
async def test_bundled_pcie_bw_low_flags_gpu_4_only() -> None:
    result = await judge_machine(load_machine_spec("pcie-bw-low"))
    assert codes_by_gpu(result) == {4: ["PCIE_BW_LOW"]}
    assert (result.findings[0].values["h2d_gbps"], result.findings[0].values["d2h_gbps"]) == (
        9.0,
        9.0,
    )
    assert entity_status(result, 4).values["link_gbps"] == 63.02


@pytest.mark.anyio
async def test_sim_link_fault_passes_when_the_gpu_delivers_what_the_link_carries() -> None:
    result = await judge_machine(spec([{"gpu": 1, "at": 10, "pcie": {"gen": 4}}]), t=15)
    assert result.status is Severity.PASS
    degraded = entity_status(result, 1).values
    assert (degraded["link_gbps"], degraded["max_link_gbps"]) == (31.51, 63.02)
