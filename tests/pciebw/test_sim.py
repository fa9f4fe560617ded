"""The simulated probe from machine specs: healthy defaults at 85% of the current
link, spec-wide and per-fault bandwidth, faults that come and go, link faults, a busy
GPU's traffic sharing the link, lost/missing GPUs and an absent driver; a busy GPU as
the fake NVML library shows it; and the check end to end on simulated machines (the
real NVML reader over the fake NVML library, the simulated probe in its child),
including the bundled `pcie-bw-low` example, `healthd check --sim` and `healthd record`
on a busy machine; and NVML let go for a GPU reset in the middle of a run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from checks.base import CheckResult, Severity
from checks.nvml_reader import NvmlReader
from checks.pciebw import PcieBwCheck
from checks.pciebw_probe import ProbeError, ProbeUnavailable
from checks.probes import Bandwidth, Probes
from checks.snapshot import NodeSnapshot
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.fakenvml import install
from healthd.sim.machine import (
    GpuFault,
    MachineSpec,
    load_machine_spec,
    parse_machine_spec,
)
from tests.agent.harness import eventually
from tests.checks.gpufakes import codes_by_gpu, context, entity_status, run

MIB = 1 << 20
RELEASED = "NVML released for a GPU reset"


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


async def judge_machine(machine: MachineSpec, t: float = 0.0, **params: object) -> CheckResult:
    """The check on the simulated machine at `t`: NVML (the snapshot, what uses each
    GPU) through the real reader, each GPU measured in the simulated child."""
    with install(machine, clock=lambda: t):
        probe = SimBandwidthProbe(machine, clock=lambda: t)
        check = PcieBwCheck({"busy_retries": 0, **params}, probes=Probes(bandwidth=probe))
        reader = NvmlReader()
        try:
            return await run(check, context(reader.read()))
        finally:
            reader.close()


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


BUSY = {"gpu": 1, "busy": {"processes": 1, "pcie_rx_gbps": 24.8}}


def test_a_busy_gpus_traffic_shares_the_link_with_the_probe() -> None:
    machine = spec([BUSY, {"gpu": 2, "busy": {"processes": 2, "pcie_tx_gbps": 80.0}}])
    assert measure(machine, 1) == (28.76, 53.56)  # 53.56 - 24.8 host-to-device
    assert measure(machine, 2) == (53.56, 2.68)  # never below 5% of the link's share
    assert measure(machine, 0) == (53.56, 53.56)


def test_nvml_shows_a_busy_gpus_processes_and_traffic() -> None:
    machine = spec([{**BUSY, "busy": {"processes": 2, "pcie_rx_gbps": 24.8,
                                      "pcie_tx_gbps": 0.5}}])
    with install(machine):
        reader = NvmlReader()
        try:
            busy, idle = (reader.activity(machine.pci_bus_id(i)) for i in (1, 0))
        finally:
            reader.close()
    assert busy.pids == (40100, 40101)
    assert (busy.rx_kbps, busy.tx_kbps) == (24_800_000, 500_000)
    assert (idle.pids, idle.rx_kbps, idle.tx_kbps, idle.problem) == ((), 0, 0, "")


def test_a_vm_that_cannot_list_processes_says_why() -> None:
    machine = spec(unsupported=["nvmlDeviceGetComputeRunningProcesses"])
    with install(machine):
        reader = NvmlReader()
        try:
            seen = reader.activity(machine.pci_bus_id(0))
        finally:
            reader.close()
    assert seen.pids is None and seen.rx_kbps == 0
    assert seen.problem == "nvmlDeviceGetComputeRunningProcesses: not supported"


@pytest.mark.anyio
async def test_a_busy_gpu_is_skipped_on_the_simulated_machine() -> None:
    result = await judge_machine(spec([BUSY]))
    assert not result.findings and result.status is Severity.PASS
    row = entity_status(result, 1)
    assert (row.status, row.reason) == (
        Severity.SKIPPED, "busy: 1 process, 24.8 GB/s other H2D traffic; not judged")


@pytest.mark.anyio
async def test_the_busy_gpus_low_rate_is_what_a_busy_blind_check_would_flag() -> None:
    # What the probe measures beside the job is below the bar (the false PCIE_BW_LOW
    # of a check that does not ask NVML); the check does not judge it.
    machine = spec([BUSY])
    low = SimBandwidthProbe(machine, clock=lambda: 0.0).rates(machine.pci_bus_id(1), MIB, 1)
    assert low.h2d_gbps < 0.7 * 63.02
    assert not (await judge_machine(machine)).findings


@pytest.mark.anyio
async def test_an_idle_gpu_with_low_bandwidth_is_still_warn_beside_a_busy_one() -> None:
    machine = spec([BUSY, {"gpu": 3, "pcie_bandwidth_gbps": {"h2d": 9.0}}])
    result = await judge_machine(machine)
    assert codes_by_gpu(result) == {3: ["PCIE_BW_LOW"]}
    assert entity_status(result, 1).status is Severity.SKIPPED


@pytest.mark.anyio
async def test_a_busy_fault_that_ends_is_judged_on_the_try_again() -> None:
    machine = spec([{**BUSY, "until": 0.3}, {"gpu": 1, "pcie_bandwidth_gbps": {"h2d": 9.0}}])
    with install(machine):  # the machine's clock: real time from now
        probe = SimBandwidthProbe(machine)
        check = PcieBwCheck({"busy_retries": 1, "busy_retry_s": 0.5},
                            probes=Probes(bandwidth=probe))
        reader = NvmlReader()
        try:
            result = await run(check, context(reader.read()))
        finally:
            reader.close()
    assert codes_by_gpu(result) == {1: ["PCIE_BW_LOW"]}


def healthd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def write_busy_machine(tmp_path: Path) -> tuple[Path, Path]:
    machine, config = tmp_path / "busy.yaml", tmp_path / "healthd.yaml"
    machine.write_text(yaml.safe_dump({"gpus": {"count": 2}, "faults": [BUSY]}))
    config.write_text("checks: {pciebw: {params: {busy_retries: 0}}}\n")
    return machine, config


def pciebw_rows(report: str) -> dict[str, tuple[str, str]]:
    (check,) = [c for c in json.loads(report)["checks"] if c["check"] == "pciebw"]
    return {row["entity"]["name"]: (row["status"], row.get("reason", ""))
            for row in check["entities"]}


def test_healthd_check_sim_says_busy(tmp_path: Path) -> None:
    machine, config = write_busy_machine(tmp_path)
    proc = healthd("check", "--sim", str(machine), "--checks", "pciebw", "--config", str(config),
                   "--output", "json")
    assert proc.returncode == 0, proc.stderr
    rows = pciebw_rows(proc.stdout)
    assert rows["1"] == ("SKIPPED", "busy: 1 process, 24.8 GB/s other H2D traffic; not judged")
    assert rows["0"][0] == "PASS"


def test_a_recording_of_a_busy_machine_replays_busy(tmp_path: Path) -> None:
    machine, config = write_busy_machine(tmp_path)
    recording = tmp_path / "recorded.yaml"
    proc = healthd("record", "--sim", str(machine), "--include", "pciebw", "--include",
                   "xid-window=0s", "--output", str(recording))
    assert proc.returncode == 0, proc.stderr
    recorded = yaml.safe_load(recording.read_text())
    (busy,) = [f for f in recorded["faults"] if "busy" in f]
    assert (busy["gpu"], busy["busy"]) == (
        1, {"processes": 1, "pcie_rx_gbps": 24.8, "pcie_tx_gbps": 0.0})
    assert "pcie_bandwidth_gbps" not in busy  # a busy GPU is not measured
    assert "pciebw" in recorded["recorded"]
    replay = healthd("check", "--sim", str(recording), "--checks", "pciebw", "--config",
                     str(config), "--output", "json")
    assert pciebw_rows(replay.stdout)["1"][0] == "SKIPPED"


@pytest.mark.anyio
async def test_a_release_for_a_gpu_reset_waits_for_the_copy_in_flight_and_stops_the_rest(
) -> None:
    """NVML's owner lets go of the GPUs (a GPU reset) while the check runs: the copy in
    flight ends before the session does, no other GPU is measured (each UNKNOWN), and
    nothing from the gap passes."""
    machine = spec()
    with install(machine) as fake:
        reader = NvmlReader()
        measured: list[str] = []
        releasing = threading.Thread(target=reader.release, args=(RELEASED,))

        class ReleasedMidway(SimBandwidthProbe):
            async def measure(self, pci_bus_id: str, size_bytes: int,
                              iterations: int) -> Bandwidth:
                measured.append(pci_bus_id)
                releasing.start()  # the owner lets go while this copy runs
                await eventually(lambda: reader.released == RELEASED, what="the release")
                assert fake.sessions().holding  # held until the copy ends
                return await super().measure(pci_bus_id, size_bytes, iterations)

        check = PcieBwCheck({"busy_retries": 0}, probes=Probes(
            bandwidth=ReleasedMidway(machine, clock=fake.clock), gpu_activity=reader))
        result = await run(check, context(reader.read()))
        releasing.join(timeout=10)
        assert measured == [machine.pci_bus_id(0)]
        assert [entity_status(result, i).status for i in range(4)] == [
            Severity.PASS, Severity.UNKNOWN, Severity.UNKNOWN, Severity.UNKNOWN]
        assert entity_status(result, 1).reason == RELEASED
        assert result.status is Severity.UNKNOWN
        assert not releasing.is_alive() and not fake.sessions().holding
