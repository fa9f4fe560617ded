"""Judging with a fake probe on idle GPUs: pass, low bandwidth on exactly one GPU,
probe errors as UNKNOWN (never PASS), a degraded link judged against what it carries
now, lost and MIG GPUs, bad parameters, a hung measurement. Busy GPUs: test_busy.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checks.base import CheckContext, CheckResult, Severity, run_check
from checks.catalog import Catalog
from checks.pciebw import PcieBwCheck
from checks.pciebw_probe import ProbeError, ProbeUnavailable
from checks.probes import Bandwidth, Probes
from checks.snapshot import DRIVER_NOT_FOUND, Failed, NodeSnapshot, Ok, PcieLink, Unsupported
from tests.checks.gpufakes import codes_by_gpu, context, entity_status, healthy_gpu, node, run

from .fakes import BlockingProbe, FakeActivity, FakeProbe

pytestmark = pytest.mark.anyio
MIB = 1 << 20


def bus(index: int) -> str:
    return healthy_gpu(index).pci_bus_id


async def judge(
    probe: object, snapshot: NodeSnapshot | None = None, **params: object
) -> CheckResult:
    check = PcieBwCheck(params, probes=Probes(bandwidth=probe,  # type: ignore[arg-type]
                                              gpu_activity=FakeActivity()))
    return await run(check, context(snapshot or node(count=8)))


async def test_healthy_node_passes_with_measured_and_link_rates() -> None:
    probe = FakeProbe()
    result = await judge(probe)
    assert result.status is Severity.PASS and not result.findings
    assert [c[0] for c in probe.calls] == [bus(i) for i in range(8)]  # one GPU at a time
    assert {c[1:] for c in probe.calls} == {(64 * MIB, 5)}
    values = entity_status(result, 3).values
    assert (values["h2d_gbps"], values["d2h_gbps"]) == (52.0, 53.0)
    assert values["link_gbps"] == values["max_link_gbps"] == 63.02


async def test_low_bandwidth_on_one_gpu_is_pcie_bw_low_on_that_gpu_only() -> None:
    result = await judge(FakeProbe({bus(4): Bandwidth(9.0, 9.5)}))
    assert codes_by_gpu(result) == {4: ["PCIE_BW_LOW"]}
    (finding,) = result.findings
    assert finding.severity is Severity.WARN and result.status is Severity.WARN
    assert finding.values["h2d_gbps"] == 9.0 and finding.values["d2h_gbps"] == 9.5
    assert finding.values["expected_h2d_gbps"] == finding.values["expected_d2h_gbps"] == 44.11
    assert "H2D 9.0 GB/s" in finding.message and "D2H 9.5 GB/s" in finding.message
    assert "44.1 GB/s" in finding.message and "Gen5 x16" in finding.message
    assert entity_status(result, 0).status is Severity.PASS


async def test_one_slow_direction_is_enough_and_named() -> None:
    result = await judge(FakeProbe({bus(2): Bandwidth(52.0, 20.0)}))
    (finding,) = result.findings
    assert finding.entity.index == 2
    assert "D2H 20.0 GB/s (low)" in finding.message and "H2D 52.0 GB/s," in finding.message


async def test_min_fraction_sets_the_bar() -> None:
    strict = await judge(FakeProbe(), min_fraction=0.9)  # 52 < 0.9 x 63
    assert set(codes_by_gpu(strict)) == set(range(8))
    lenient = await judge(FakeProbe(default=Bandwidth(30.0, 30.0)), min_fraction=0.4)
    assert lenient.status is Severity.PASS


async def test_size_and_iterations_reach_the_probe() -> None:
    probe = FakeProbe()
    await judge(probe, node(count=1), size_mib=64, iterations=2)
    assert probe.calls == [(bus(0), 64 * MIB, 2)]


async def test_probe_error_is_unknown_for_that_gpu_never_pass() -> None:
    error = ProbeError("cuMemcpyHtoDAsync_v2 failed: CUDA_ERROR_ILLEGAL_ADDRESS")
    result = await judge(FakeProbe({bus(1): error}))
    assert result.status is Severity.UNKNOWN and not result.findings
    bad = entity_status(result, 1)
    assert bad.status is Severity.UNKNOWN and "CUDA_ERROR_ILLEGAL_ADDRESS" in bad.reason
    assert entity_status(result, 2).status is Severity.PASS


@pytest.mark.parametrize(
    "answer",
    [RuntimeError("probe bug"), None, Bandwidth(float("nan"), 50.0), Bandwidth(0.0, 50.0)],
    ids=["exception", "none", "nan", "zero"],
)
async def test_broken_probe_answers_are_unknown(answer: object) -> None:
    result = await judge(FakeProbe({bus(0): answer}), node(count=2))
    assert entity_status(result, 0).status is Severity.UNKNOWN
    assert entity_status(result, 1).status is Severity.PASS


@pytest.mark.parametrize(
    "reason", ["CUDA driver not found", "cuInit failed: CUDA_ERROR_NO_DEVICE"]
)
async def test_unusable_driver_is_unknown_for_the_whole_check(reason: str) -> None:
    result = await judge(FakeProbe(default=ProbeUnavailable(reason)))
    assert (result.status, result.reason) == (Severity.UNKNOWN, reason)
    assert not result.findings


async def test_degraded_link_is_judged_against_the_current_link() -> None:
    gen4 = Ok(PcieLink(gen=4, width=16, max_gen=5, max_width=16))
    snapshot = node(healthy_gpu(0, pcie=gen4), healthy_gpu(1, pcie=gen4))
    probe = FakeProbe({bus(0): Bandwidth(26.0, 26.5), bus(1): Bandwidth(15.0, 26.0)})
    result = await judge(probe, snapshot)
    fine = entity_status(result, 0)
    assert fine.status is Severity.PASS  # 26 GB/s is plenty for Gen4 x16 (31.5)
    assert (fine.values["link_gbps"], fine.values["max_link_gbps"]) == (31.51, 63.02)
    assert codes_by_gpu(result) == {1: ["PCIE_BW_LOW"]}
    assert result.findings[0].values["expected_h2d_gbps"] == 22.06  # 0.7 x 31.51


async def test_unreadable_link_is_unknown_with_the_measurement_kept() -> None:
    snapshot = node(healthy_gpu(0, pcie=Failed("NVML_ERROR_UNKNOWN")), healthy_gpu(1))
    result = await judge(FakeProbe(default=Bandwidth(1.0, 1.0)), snapshot)
    unreadable = entity_status(result, 0)
    assert unreadable.status is Severity.UNKNOWN and "PCIe link" in unreadable.reason
    assert unreadable.values["h2d_gbps"] == 1.0
    assert codes_by_gpu(result) == {1: ["PCIE_BW_LOW"]}


async def test_unsupported_link_is_skipped() -> None:
    result = await judge(FakeProbe(), node(healthy_gpu(0, pcie=Unsupported())))
    assert entity_status(result, 0).status is Severity.SKIPPED


async def test_impossible_link_values_are_unknown() -> None:
    odd = Ok(PcieLink(gen=0, width=16, max_gen=5, max_width=16))
    result = await judge(FakeProbe(default=Bandwidth(1.0, 1.0)), node(healthy_gpu(0, pcie=odd)))
    assert entity_status(result, 0).status is Severity.UNKNOWN and not result.findings


async def test_lost_and_mig_gpus_are_not_measured() -> None:
    snapshot = node(
        healthy_gpu(0, lost=True, lost_reason="GPU_IS_LOST"),
        healthy_gpu(1, mig_enabled=True),
        healthy_gpu(2),
    )
    probe = FakeProbe()
    result = await judge(probe, snapshot)
    assert [c[0] for c in probe.calls] == [bus(2)]
    assert entity_status(result, 0).status is Severity.UNKNOWN
    assert entity_status(result, 1).status is Severity.SKIPPED


async def test_no_driver_is_unknown_without_measuring() -> None:
    probe = FakeProbe()
    no_source = await run(PcieBwCheck(probes=Probes(bandwidth=probe,
                                                    gpu_activity=FakeActivity())),
                          CheckContext(catalog=Catalog()))
    driver_error = await judge(probe, replace(node(count=2), driver_error=DRIVER_NOT_FOUND))
    for result in (no_source, driver_error):
        assert (result.status, result.reason) == (Severity.UNKNOWN, DRIVER_NOT_FOUND)
    assert probe.calls == []


async def test_a_probe_without_measure_is_unknown() -> None:
    result = await judge(object())
    assert result.status is Severity.UNKNOWN and "no measure()" in result.reason


async def test_hung_measurement_ends_at_the_deadline_as_unknown() -> None:
    probe = BlockingProbe()
    try:
        check = PcieBwCheck(probes=Probes(bandwidth=probe, gpu_activity=FakeActivity()))
        result = await run_check(check, context(node(count=1)), timeout_s=0.2)
    finally:
        probe.release.set()
    assert result.status is Severity.UNKNOWN and "timed out" in result.reason
    assert result.duration_s < 5


async def test_a_measurement_past_probe_timeout_is_unknown_for_that_gpu_only() -> None:
    probe = BlockingProbe()
    try:
        check = PcieBwCheck({"probe_timeout_s": 0.1},
                            probes=Probes(bandwidth=probe, gpu_activity=FakeActivity()))
        result = await run_check(check, context(node(count=2)), timeout_s=5)
    finally:
        probe.release.set()
    for gpu in (0, 1):
        row = entity_status(result, gpu)
        assert row.status is Severity.UNKNOWN and "did not finish within 0.1 s" in row.reason
    assert result.status is Severity.UNKNOWN and not result.findings


@pytest.mark.parametrize(
    "params",
    [{"min_fraction": 0}, {"min_fraction": 1.5}, {"size_mib": 0}, {"iterations": 0}, {"x": 1},
     {"probe_timeout_s": 0}, {"busy_gbps": 0}, {"busy_retries": -1}, {"busy_retry_s": -1}],
)
def test_bad_params_are_refused(params: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PcieBwCheck(params)


def test_defaults() -> None:
    check = PcieBwCheck()
    assert (check.NAME, check.DEFAULT_INTERVAL_S) == ("pciebw", 3600)
    assert check.params.model_dump() == {
        "min_fraction": 0.7, "size_mib": 64, "iterations": 5, "probe_timeout_s": 30.0,
        "busy_gbps": 1.0, "busy_retries": 2, "busy_retry_s": 10.0, "free_gpus_only": False}
