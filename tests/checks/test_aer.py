"""The `aer` check on a simulated machine: the real NVML pass names each GPU's PCI
address, the real sysfs reader reads the fake /sys/bus/pci/devices tree the machine
spec describes, and a test bumps counters while checks run (a fault injected into
the machine, as a failing link would):

- the first run only takes the baseline; counts that stay put give nothing;
- a fatal or non-fatal count that grows on the GPU, a bridge above it or its root
  port is PCIE_AER_FATAL (EVICT) or PCIE_AER_NONFATAL (ERR) on that GPU alone,
  naming the device and the error; a bridge above two GPUs is reported on both; a
  GPU that fell off the bus still shows the error above it;
- correctable errors are PCIE_AER_CORRECTABLE (WARN) only above the rate;
- counters that cannot be read are SKIPPED with the reason, never PASS;
- a recording holds the path and the counters and replays them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
import yaml

from checks.aer import AerCheck, parse_aer, sysfs_address
from checks.base import CheckContext, CheckResult, Severity, run_check
from checks.catalog import Catalog
from checks.probes import Probes
from checks.snapshot import NvmlGpuSource
from healthd.cli import main
from healthd.sim.aer import SimAer, SimAerReader
from healthd.sim.machine import AerFault, GpuFault, parse_machine_spec
from healthd.sim.node import SimulatedNode, simulate

from .gpufakes import context, node

pytestmark = pytest.mark.anyio


@contextmanager
def machine(**spec: Any) -> Iterator[SimulatedNode]:
    with simulate(parse_machine_spec({"gpus": {"count": 2}, **spec})) as sim:
        yield sim


class Clock:
    """Seconds since boot, stepped by the test (the correctable rate's clock)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def aer_check(sim: SimulatedNode, clock: Clock | None = None, **params: Any) -> AerCheck:
    probes = sim.probes()
    return AerCheck(params, probes=replace(probes, uptime=clock) if clock else probes)


async def run(check: AerCheck, gpus: NvmlGpuSource | None = None) -> CheckResult:
    """One round; on `gpus`, an NVML session kept across rounds (as the agent's)."""
    source = gpus or NvmlGpuSource()
    source.new_round()
    try:
        return await run_check(check, CheckContext(catalog=Catalog(), gpus=source))
    finally:
        if gpus is None:
            await source.aclose()


def bump(sim: SimulatedNode, gpu: int, level: int, kind: str, name: str, n: int = 1) -> None:
    """`n` more `name` errors on the device `level` steps above GPU `gpu` (0: itself)."""
    sim.nvml.inject(GpuFault(gpu=gpu, aer=[AerFault(level=level, **{kind: {name: n}})]))


def codes(result: CheckResult) -> dict[int | None, list[tuple[str, Severity]]]:
    out: dict[int | None, list[tuple[str, Severity]]] = {}
    for f in result.findings:
        out.setdefault(f.entity.index, []).append((f.code, f.severity))
    return out


def row(result: CheckResult, gpu: int) -> Any:
    (found,) = [e for e in result.entities if e.entity.index == gpu]
    return found


def test_the_kernels_format_and_addresses_are_read_as_written() -> None:
    old = "Receiver Error 2\nBad TLP 0\nRELAY_NUM Rollover 0\nTOTAL_ERR_COR 2\n"  # 4.19
    assert parse_aer(old) == {"Receiver Error": 2, "Bad TLP": 0, "RELAY_NUM Rollover": 0,
                              "TOTAL_ERR_COR": 2}
    assert parse_aer("RxErr 1\nTOTAL_ERR_COR 1\n") == {"RxErr": 1, "TOTAL_ERR_COR": 1}
    with pytest.raises(ValueError):
        parse_aer("garbage\n")
    assert sysfs_address("00000000:1A:00.0") == "0000:1a:00.0"
    assert sysfs_address("0000:18:00.0") == "0000:18:00.0" and sysfs_address("") == ""


async def test_the_first_run_is_a_baseline_and_steady_counts_give_nothing() -> None:
    counts = {"0000:17:00.0": {"fatal": {"SDES": 1}}, "0000:28:00.0": {"nonfatal": {"CmpltTO": 2}}}
    with machine(aer={"counts": counts}) as sim:
        check = aer_check(sim)
        first = await run(check)
        assert (first.status, first.findings) == (Severity.PASS, ())
        gpu0, gpu1 = row(first, 0).values, row(first, 1).values
        assert (gpu0["aer_upstream_fatal"], gpu1["aer_nonfatal"]) == (1, 2)  # since boot
        assert gpu0["pci_path"] == "0000:15:01.0 > 0000:16:00.0 > 0000:17:00.0 > 0000:18:00.0"
        again = await run(check)
        assert (again.status, again.findings) == (Severity.PASS, ())


@pytest.mark.parametrize(("kind", "name", "n", "code", "severity"), [
    ("fatal", "SDES", 1, "PCIE_AER_FATAL", Severity.EVICT),
    ("nonfatal", "CmpltTO", 1, "PCIE_AER_NONFATAL", Severity.ERR),
    ("correctable", "BadTLP", 50, "PCIE_AER_CORRECTABLE", Severity.WARN),
])
@pytest.mark.parametrize(("level", "where"), [
    (0, "GPU 0000:28:00.0"), (1, "bridge 0000:27:00.0"), (3, "root port 0000:25:01.0")])
async def test_growth_on_the_gpu_or_above_it_is_a_finding_on_that_gpu(
        kind: str, name: str, n: int, code: str, severity: Severity, level: int,
        where: str) -> None:
    with machine() as sim:
        check = aer_check(sim)
        await run(check)  # the baseline
        bump(sim, 1, level, kind, name, n)
        grown = await run(check)
        assert codes(grown) == {1: [(code, severity)]}
        assert f"{where}: {name} +{n}" in grown.findings[0].message
        assert row(grown, 0).status is Severity.PASS
        steady = await run(check)  # the errors were counted once
        assert steady.findings == ()


async def test_errors_a_spec_schedules_are_seen_by_the_first_run_after_them(
        tmp_path: Path) -> None:
    """A spec's `aer` fault at 30 s: counted from then on, on the machine's clock."""
    spec = parse_machine_spec({"gpus": {"count": 2}, "faults": [
        {"gpu": 0, "at": 30, "until": 40, "aer": [{"level": 1, "nonfatal": {"CmpltTO": 1}}]}]})
    clock = Clock()
    tree = SimAer(tmp_path, spec, clock, spec.faults_for)
    check = AerCheck(probes=Probes(aer=SimAerReader(tree), uptime=clock))
    snapshot = node(count=2)  # the default bus ids, as the machine's
    clock.now = 29.0
    assert (await run_check(check, context(snapshot))).findings == ()
    clock.now = 30.0
    assert codes(await run_check(check, context(snapshot))) == {
        0: [("PCIE_AER_NONFATAL", Severity.ERR)]}
    clock.now = 45.0  # after `until`: counted errors stay counted, nothing new
    assert (await run_check(check, context(snapshot))).findings == ()


async def test_a_bridge_above_two_gpus_is_reported_on_both() -> None:
    shared = ["0000:17:00.0", "0000:16:00.0", "0000:15:01.0"]
    upstream = {0: shared, 1: ["0000:27:00.0", *shared[1:]]}  # one switch, two ports
    with machine(aer={"upstream": upstream}) as sim:
        check = aer_check(sim)
        await run(check)
        bump(sim, 0, 2, "fatal", "DLP")  # the switch's upstream port
        grown = await run(check)
        assert codes(grown) == {0: [("PCIE_AER_FATAL", Severity.EVICT)],
                                1: [("PCIE_AER_FATAL", Severity.EVICT)]}
        assert all("bridge 0000:16:00.0: DLP +1" in f.message for f in grown.findings)


async def test_a_gpu_that_fell_off_the_bus_still_shows_the_error_above_it() -> None:
    with machine() as sim:
        check, gpus = aer_check(sim), NvmlGpuSource()
        await run(check, gpus)  # NVML names the GPU's address while it is there
        bump(sim, 1, 3, "fatal", "SDES")
        sim.nvml.inject(GpuFault(gpu=1, lost=True))
        fell = await run(check, gpus)
        await gpus.aclose()
        assert codes(fell) == {1: [("PCIE_AER_FATAL", Severity.EVICT)]}
        assert "root port 0000:25:01.0: SDES +1" in fell.findings[0].message


async def test_correctable_errors_count_only_above_the_rate() -> None:
    clock = Clock()
    with machine() as sim:
        check = aer_check(sim, clock, max_correctable_per_min=8)
        await run(check)
        bump(sim, 0, 1, "correctable", "RxErr", 8)  # 8 within a minute: tolerated
        clock.now += 10
        assert (await run(check)).findings == ()
        bump(sim, 0, 1, "correctable", "RxErr", 15)  # 15 in two minutes: tolerated
        clock.now += 120
        assert (await run(check)).findings == ()
        bump(sim, 0, 0, "correctable", "BadDLLP", 9)  # 9 within a minute: too many
        clock.now += 30
        grown = await run(check)
        assert codes(grown) == {0: [("PCIE_AER_CORRECTABLE", Severity.WARN)]}
        assert "9 correctable errors in 30 s" in grown.findings[0].message


async def test_a_machine_without_aer_is_skipped_with_the_reason() -> None:
    with machine(aer={"supported": False}) as sim:
        result = await run(aer_check(sim))
    assert result.status is Severity.SKIPPED
    assert row(result, 0).reason == ("PCIe AER: no counters on GPU 0000:18:00.0 or the 3 "
                                     "bridges above it: no AER capability (no aer_dev_* files)")


async def test_a_device_without_aer_leaves_the_rest_of_the_path_judged() -> None:
    with machine(aer={"without_aer": ["0000:18:00.0"]}) as sim:
        check = aer_check(sim)
        first = await run(check)
        assert row(first, 0).status is Severity.PASS
        assert row(first, 0).values["aer_unreadable"] == "0000:18:00.0"
        assert "aer_fatal" not in row(first, 0).values  # never a zero it did not read
        bump(sim, 0, 3, "nonfatal", "UnsupReq")
        assert codes(await run(check)) == {0: [("PCIE_AER_NONFATAL", Severity.ERR)]}


async def test_gpus_missing_from_sysfs_are_skipped_with_the_reason(tmp_path: Path) -> None:
    with machine() as sim:
        result = await run(AerCheck({"sysfs_root": str(tmp_path)}, probes=replace(
            sim.probes(), aer=None)))  # the real reader, on a tree without the GPUs
    assert result.status is Severity.SKIPPED
    assert row(result, 1).reason == f"PCIe AER: no PCI device 0000:28:00.0 in {tmp_path}"


def test_a_recording_holds_the_path_and_counters_and_replays_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "gpus": {"count": 2, "pci_bus_ids": ["00000000:18:00.0", "00000000:00:06.0"]},
        "aer": {"counts": {"0000:16:00.0": {"correctable": {"RxErr": 3, "TOTAL_ERR_COR": 2}},
                           "0000:18:00.0": {"fatal": {"SDES": 1}}},
                "without_aer": ["0000:15:01.0"]}}))
    recording = tmp_path / "recorded.yaml"
    assert main(["record", "--sim", str(spec), "--output", str(recording)]) == 0
    recorded = yaml.safe_load(recording.read_text())
    assert "aer" in recorded["recorded"]
    assert recorded["aer"]["upstream"] == {
        0: ["0000:17:00.0", "0000:16:00.0", "0000:15:01.0"], 1: []}

    def aer_rows(source: Path) -> list[dict[str, Any]]:
        capsys.readouterr()
        main(["check", "--sim", str(source), "--checks", "aer", "--output", "json"])
        (report,) = yaml.safe_load(capsys.readouterr().out)["checks"]
        return list(report["entities"])

    assert aer_rows(recording) == aer_rows(spec)
    assert aer_rows(recording)[0]["values"]["aer_upstream_correctable"] == 2  # the total


async def test_a_replayed_recording_still_sees_new_errors(tmp_path: Path) -> None:
    recording = tmp_path / "recorded.yaml"
    record = ["record", "--sim", "healthy-8xh100", "--output", str(recording)]
    assert await anyio.to_thread.run_sync(main, record) == 0  # a command runs its own loop
    with simulate(str(recording)) as sim:
        check = aer_check(sim)
        await run(check)
        bump(sim, 5, 2, "fatal", "SDES")
        assert codes(await run(check)) == {5: [("PCIE_AER_FATAL", Severity.EVICT)]}
