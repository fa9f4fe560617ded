"""The `sxid` check: NVSwitch errors from the kernel log, one finding per NVSwitch
and code; fatal ones (NVIDIA's lists, or the driver's own word) are a sticky EVICT,
corrected ones informational; no log is SKIPPED, an unreadable one UNKNOWN."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.base import CheckContext, Severity
from checks.catalog import Catalog
from checks.kernel_log import KernelLog
from checks.probes import KernelLogSource, Probes
from checks.snapshot import Fabric, Ok
from checks.sxid import SxidCheck
from healthd.sim.kernellog import NotRecordedLog, SimKernelLog

from .gpufakes import FakeGpus, healthy_gpu, node, run

pytestmark = pytest.mark.anyio


def line(switch: int, sxid: int, word: str, text: str = "Link 3 some error") -> str:
    return f"nvidia-nvswitch{switch}: SXid (PCI:0000:0{switch}:00.0): {sxid}, {word}, {text}"


HGX = node(*(healthy_gpu(i, fabric=Ok(Fabric("completed"))) for i in range(8)))


def on(snapshot: object = HGX) -> CheckContext:
    return CheckContext(catalog=Catalog(), gpus=FakeGpus([snapshot]))  # type: ignore[list-item]


def reading(log: KernelLogSource | None) -> SxidCheck:
    """The check reading `log`."""
    return SxidCheck(probes=Probes(kernel_log=log))


def log_with(tmp_path: Path, *messages: str) -> KernelLog:
    sim = SimKernelLog(tmp_path / "kmsg", lambda: 50.0)
    sim.write_history(messages)
    return KernelLog(sim.path)


async def test_fatal_sxid_is_a_sticky_evict_on_its_nvswitch(tmp_path: Path) -> None:
    log = log_with(tmp_path, line(1, 12020, "Fatal", "Link 46 egress sequence ID error"),
                   line(1, 12020, "Fatal", "Link 46 egress sequence ID error"),
                   line(2, 11012, "Non-fatal", "Link 2 single bit ECC error"))
    result = await run(reading(log), on())
    assert result.status is Severity.EVICT
    by_code = {f.code: f for f in result.findings}
    fatal = by_code["SXID_12020"]
    assert (fatal.severity, fatal.sticky, fatal.entity.name) == (Severity.EVICT, True, "nvswitch1")
    assert fatal.values["count"] == 2 and fatal.values["link"] == 46
    assert fatal.message == "fatal SXID 12020: Link 46 egress sequence ID error (2 lines)"
    assert by_code["SXID_11012"].severity is Severity.PASS  # corrected: for the record


async def test_an_unlisted_sxid_the_driver_calls_fatal_is_still_fatal(tmp_path: Path) -> None:
    result = await run(reading(log_with(tmp_path, line(0, 29999, "Fatal"))), on())
    assert [(f.code, f.severity) for f in result.findings] == [("SXID_FATAL", Severity.EVICT)]


async def test_each_line_is_reported_once(tmp_path: Path) -> None:
    check = reading(log_with(tmp_path, line(0, 12020, "Fatal")))
    assert (await run(check, on())).status is Severity.EVICT
    again = await run(check, on())
    assert again.status is Severity.PASS and again.findings == ()


async def test_without_a_log_skipped_unreadable_unknown(tmp_path: Path) -> None:
    assert (await run(SxidCheck(), on())).status is Severity.SKIPPED
    replay = await run(reading(NotRecordedLog()), on())
    assert replay.status is Severity.SKIPPED
    assert replay.entities[0].reason == "not recorded"
    absent = reading(KernelLog(tmp_path / "absent"))
    assert (await run(absent, on())).status is Severity.SKIPPED
    unreadable = tmp_path / "kmsg"
    unreadable.mkdir()  # opens, but every read fails
    broken = await run(reading(KernelLog(unreadable)), on())
    assert broken.status is Severity.UNKNOWN


async def test_no_fabric_or_no_driver_is_never_a_pass(tmp_path: Path) -> None:
    check = reading(log_with(tmp_path))
    pcie = await run(check, on(node(healthy_gpu(0))))
    assert pcie.status is Severity.SKIPPED
    driverless = await run(check, on(node(driver_error="NVIDIA driver not found")))
    assert driverless.status is Severity.UNKNOWN
