"""A GPU another workload uses is never judged: SKIPPED "busy" with NVML's evidence,
before the copy (not measured at all) or after it (the measurement is discarded),
never WARN and never UNKNOWN; tried again within the run; when each GPU was last
judged; only GPUs no pod holds, when asked; what happens when NVML cannot tell."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from checks.base import CheckResult, Severity, run_check
from checks.pciebw import NOT_JUDGED, PcieBwCheck
from checks.probes import Bandwidth, GpuActivity, Probes
from tests.checks.gpufakes import context, entity_status, healthy_gpu, node

from .fakes import IDLE, FakeActivity, FakeProbe, busy

pytestmark = pytest.mark.anyio

# What a job copying host-to-device left the probe on the real H200: H2D 27.7 GB/s of
# a Gen5 x16 link that should give at least 44.1.
CONTENDED = Bandwidth(27.7, 50.6)
NO_RETRY = {"busy_retries": 0}


def bus(index: int) -> str:
    return healthy_gpu(index).pci_bus_id


def check_with(probe: FakeProbe, activity: FakeActivity, **params: object) -> PcieBwCheck:
    return PcieBwCheck({**NO_RETRY, **params},
                       probes=Probes(bandwidth=probe, gpu_activity=activity))


async def judge(probe: FakeProbe, activity: FakeActivity, count: int = 2,
                **params: object) -> CheckResult:
    return await run_check(check_with(probe, activity, **params), context(node(count=count)))


async def test_a_busy_gpu_that_measures_low_is_skipped_not_warned() -> None:
    # Today's check judged the contended copy: WARN PCIE_BW_LOW on every run.
    probe = FakeProbe({bus(1): CONTENDED})
    result = await judge(probe, FakeActivity({bus(1): [busy(1, h2d_gbps=24.8)]}))
    assert not result.findings and result.status is Severity.PASS
    row = entity_status(result, 1)
    assert row.status is Severity.SKIPPED
    assert row.reason == "busy: 1 process, 24.8 GB/s other H2D traffic; not judged"
    assert (row.values["other_processes"], row.values["other_h2d_gbps"]) == (1, 24.8)
    assert "h2d_gbps" not in row.values
    assert [call[0] for call in probe.calls] == [bus(0)]  # the job was not disturbed
    assert entity_status(result, 0).status is Severity.PASS


async def test_an_idle_gpu_with_low_bandwidth_is_still_warn() -> None:
    result = await judge(FakeProbe({bus(1): CONTENDED}), FakeActivity())
    assert [(f.code, f.entity.index, f.severity) for f in result.findings] == [
        ("PCIE_BW_LOW", 1, Severity.WARN)]


async def test_a_job_that_only_computes_is_busy_too() -> None:
    result = await judge(FakeProbe(), FakeActivity({bus(0): [busy(2)]}))
    assert entity_status(result, 0).reason == "busy: 2 processes; not judged"


async def test_traffic_without_a_process_is_busy_above_busy_gbps() -> None:
    quiet = GpuActivity(pids=(), rx_kbps=500_000, tx_kbps=0)  # 0.5 GB/s: housekeeping
    loud = GpuActivity(pids=(), rx_kbps=0, tx_kbps=3_000_000)  # a peer GPU reading it
    result = await judge(FakeProbe(default=CONTENDED),
                         FakeActivity({bus(0): [quiet], bus(1): [loud]}))
    assert [f.entity.index for f in result.findings] == [0]
    assert entity_status(result, 1).reason == "busy: 3.0 GB/s other D2H traffic; not judged"


async def test_a_gpu_that_became_busy_during_the_copy_is_discarded() -> None:
    probe = FakeProbe({bus(0): CONTENDED})
    result = await judge(probe, FakeActivity({bus(0): [IDLE, busy(1, h2d_gbps=30.0)]}))
    assert not result.findings
    row = entity_status(result, 0)
    assert row.status is Severity.SKIPPED and row.reason.startswith("busy: 1 process")
    assert "h2d_gbps" not in row.values and "last_judged" not in row.values
    assert [call[0] for call in probe.calls] == [bus(0), bus(1)]  # it was measured


async def test_the_probes_own_process_is_not_another_workload() -> None:
    probe = FakeProbe({bus(0): Bandwidth(9.0, 9.0, pid=4242)})
    still_listed = GpuActivity(pids=(4242,), rx_kbps=0, tx_kbps=0)
    result = await judge(probe, FakeActivity({bus(0): [IDLE, still_listed]}), count=1)
    assert [f.code for f in result.findings] == ["PCIE_BW_LOW"]


async def test_a_busy_gpu_is_tried_again_later_in_the_run() -> None:
    activity = FakeActivity({bus(1): [busy(1), busy(1), IDLE]})
    probe = FakeProbe({bus(1): CONTENDED})
    started = time.monotonic()
    result = await judge(probe, activity, busy_retries=2, busy_retry_s=0.05)
    waited = time.monotonic() - started
    assert [(f.code, f.entity.index) for f in result.findings] == [("PCIE_BW_LOW", 1)]
    assert [call[0] for call in probe.calls] == [bus(0), bus(1)]  # measured once idle
    assert activity.calls.count(bus(1)) == 4  # busy, busy, then idle before and after
    assert waited >= 0.05 + 0.1  # the wait doubled: 0.05 s, then 0.1 s


async def test_a_gpu_busy_on_every_try_is_skipped_after_the_retries() -> None:
    activity = FakeActivity({bus(0): [busy(1)]})
    result = await judge(FakeProbe(), activity, count=1, busy_retries=3, busy_retry_s=0.01)
    assert activity.calls.count(bus(0)) == 4
    assert result.status is Severity.SKIPPED and result.reason == NOT_JUDGED


async def test_no_retry_when_the_deadline_leaves_no_room() -> None:
    activity = FakeActivity({bus(0): [busy(1)]})
    check = check_with(FakeProbe(), activity, busy_retries=2, busy_retry_s=60)
    result = await run_check(check, context(node(count=1)), timeout_s=5)
    assert activity.calls == [bus(0)]
    assert result.status is Severity.SKIPPED and result.duration_s < 5


async def test_when_each_gpu_was_last_judged_stays_while_it_is_busy() -> None:
    activity = FakeActivity({bus(1): [busy(1)]})
    check = check_with(FakeProbe(), activity)
    before = time.time()
    first = await run_check(check, context(node(count=2)))
    judged = entity_status(first, 0).values["last_judged"]
    assert before <= judged <= time.time()
    assert "last_judged" not in entity_status(first, 1).values  # never judged here

    activity.readings[bus(0)] = [busy(1)]
    later = await run_check(check, context(node(count=2)))
    row = entity_status(later, 0)
    assert row.status is Severity.SKIPPED and row.values["last_judged"] == judged


@pytest.mark.parametrize(("pods", "measured"), [([], True), (["team/train-0"], False)])
async def test_free_gpus_only_measures_nothing_while_a_pod_holds_a_gpu(
        pods: Sequence[str], measured: bool) -> None:
    async def gpu_pods() -> Sequence[str]:
        return pods

    probe = FakeProbe()
    check = PcieBwCheck({"free_gpus_only": True},
                        probes=Probes(bandwidth=probe, gpu_activity=FakeActivity(),
                                      gpu_pods=gpu_pods))
    result = await run_check(check, context(node(count=2)))
    assert bool(probe.calls) is measured
    if not measured:
        row = entity_status(result, 0)
        assert row.status is Severity.SKIPPED
        assert row.reason == ("pods hold GPUs on this node (1: team/train-0); "
                              "not measured (free_gpus_only)")


async def test_free_gpus_only_measures_nothing_when_the_pods_are_unknown() -> None:
    async def broken() -> Sequence[str]:
        raise RuntimeError("API server unreachable")

    for pods, reason in ((None, "not known here"), (broken, "API server unreachable")):
        probe = FakeProbe()
        check = PcieBwCheck({"free_gpus_only": True},
                            probes=Probes(bandwidth=probe, gpu_activity=FakeActivity(),
                                          gpu_pods=pods))
        result = await run_check(check, context(node(count=1)))
        assert not probe.calls and reason in entity_status(result, 0).reason


async def test_a_low_rate_is_not_judged_when_nvml_cannot_list_the_processes() -> None:
    unknown = GpuActivity(pids=None, rx_kbps=None, tx_kbps=None,
                          problem="nvmlDeviceGetComputeRunningProcesses: not supported")
    activity = FakeActivity({bus(0): [unknown], bus(1): [unknown]})
    result = await judge(FakeProbe({bus(0): CONTENDED}), activity)
    assert not result.findings
    low = entity_status(result, 0)
    assert low.status is Severity.SKIPPED and "cannot be told" in low.reason
    assert "not supported" in low.reason
    good = entity_status(result, 1)  # a good rate stands: sharing only lowers it
    assert good.status is Severity.PASS and "last_judged" in good.values
