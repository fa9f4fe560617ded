"""The shared NVML check skeleton, across every NVML check: no driver, a failing
access layer, lost GPUs, MIG GPUs, unsupported and failed readings, garbage."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from checks.base import CheckContext, Severity
from checks.catalog import Catalog
from checks.ecc import EccCheck
from checks.gpucheck import GpuCheck
from checks.gpus import GpusCheck
from checks.nvlink import NvlinkCheck
from checks.pcie import PcieCheck
from checks.power import PowerCheck
from checks.remapped import RemappedCheck
from checks.snapshot import DRIVER_NOT_FOUND, Failed, NodeSnapshot, Ok, Unsupported
from checks.xid import XidCheck

from .gpufakes import codes_by_gpu, context, entity_status, healthy_gpu, node, run, status_of

ALL: list[type[GpuCheck[Any]]] = [
    RemappedCheck,
    PowerCheck,
    PcieCheck,
    EccCheck,
    NvlinkCheck,
    GpusCheck,
    XidCheck,
]

# The reading each property check cannot do without.
MAIN_READING: dict[type[GpuCheck[Any]], str] = {
    RemappedCheck: "remapped",
    PowerCheck: "clock_event_reasons",
    PcieCheck: "pcie",
    EccCheck: "ecc",
    NvlinkCheck: "nvlinks",
}
pytestmark = pytest.mark.anyio


def test_names_are_unique_and_classes_are_complete() -> None:
    assert len({c.NAME for c in ALL}) == len(ALL)
    for cls in ALL:
        assert cls.DESCRIPTION and cls.DEFAULT_INTERVAL_S == 30
        assert cls.Params.model_config.get("extra") == "forbid"
        with pytest.raises(ValueError, match="extra"):
            cls({"no_such_param": 1})


@pytest.mark.parametrize("cls", ALL)
async def test_no_gpu_source_is_unknown_driver_not_found(cls: type[GpuCheck[Any]]) -> None:
    result = await run(cls(), CheckContext(catalog=Catalog()))
    assert (result.status, result.reason) == (Severity.UNKNOWN, DRIVER_NOT_FOUND)


@pytest.mark.parametrize("cls", ALL)
async def test_driver_error_is_unknown_with_its_reason(cls: type[GpuCheck[Any]]) -> None:
    result = await run(cls(), context(NodeSnapshot(driver_error=DRIVER_NOT_FOUND)))
    assert (result.status, result.reason) == (Severity.UNKNOWN, DRIVER_NOT_FOUND)
    assert result.findings == ()


@pytest.mark.parametrize("cls", ALL)
async def test_failing_access_layer_is_unknown_not_a_crash(cls: type[GpuCheck[Any]]) -> None:
    ctx = context(node(count=1))

    async def broken() -> NodeSnapshot:
        raise RuntimeError("NVML wedged")

    ctx.gpus.snapshot = broken  # type: ignore[union-attr,method-assign]
    result = await run(cls(), ctx)
    assert result.status is Severity.UNKNOWN
    assert "NVML wedged" in result.reason


@pytest.mark.parametrize("cls", ALL)
async def test_healthy_node_passes_every_gpu(cls: type[GpuCheck[Any]]) -> None:
    result = await run(cls(), context(node(count=8)))
    assert result.status is Severity.PASS, result
    assert result.findings == ()
    assert [status_of(result, i) for i in range(8)] == [Severity.PASS] * 8


@pytest.mark.parametrize("cls", [c for c in ALL if c is not GpusCheck])
async def test_lost_gpu_is_unknown_and_others_still_judged(cls: type[GpuCheck[Any]]) -> None:
    lost = healthy_gpu(2, uuid="", pci_bus_id="", model="", lost=True, lost_reason="GPU is lost")
    result = await run(cls(), context(node(healthy_gpu(0), lost, healthy_gpu(3))))
    gpu2 = entity_status(result, 2)
    assert gpu2.status is Severity.UNKNOWN
    assert "GPU is lost" in gpu2.reason
    assert status_of(result, 0) is status_of(result, 3) is Severity.PASS
    assert 2 not in codes_by_gpu(result)  # GPU_MISSING belongs to the gpus check


@pytest.mark.parametrize("cls", ALL)
async def test_mig_gpu_is_reported_as_mig_not_failed(cls: type[GpuCheck[Any]]) -> None:
    result = await run(cls(), context(node(healthy_gpu(0, mig_enabled=True), healthy_gpu(1))))
    gpu0 = entity_status(result, 0)
    assert gpu0.values["mig"] is True
    assert gpu0.status is Severity.PASS
    assert "mig" not in entity_status(result, 1).values


@pytest.mark.parametrize("cls", list(MAIN_READING))
async def test_unsupported_reading_skips_that_gpu(cls: type[GpuCheck[Any]]) -> None:
    odd = healthy_gpu(1, **{MAIN_READING[cls]: Unsupported("not supported on this GPU")})
    result = await run(cls(), context(node(healthy_gpu(0), odd)))
    gpu1 = entity_status(result, 1)
    assert gpu1.status is Severity.SKIPPED
    assert "not supported on this GPU" in gpu1.reason
    assert status_of(result, 0) is Severity.PASS
    assert result.status is Severity.PASS


@pytest.mark.parametrize("cls", list(MAIN_READING))
async def test_failed_reading_is_unknown_with_reason(cls: type[GpuCheck[Any]]) -> None:
    odd = healthy_gpu(1, **{MAIN_READING[cls]: Failed("NVML error: Timeout")})
    result = await run(cls(), context(node(healthy_gpu(0), odd)))
    gpu1 = entity_status(result, 1)
    assert gpu1.status is Severity.UNKNOWN
    assert "NVML error: Timeout" in gpu1.reason
    assert result.status is Severity.UNKNOWN
    assert status_of(result, 0) is Severity.PASS


@pytest.mark.parametrize("cls", list(MAIN_READING))
async def test_garbage_reading_costs_only_that_gpu(cls: type[GpuCheck[Any]]) -> None:
    for garbage in (Ok(None), "Gen5", None):
        odd = healthy_gpu(1, **{MAIN_READING[cls]: garbage})
        result = await run(cls(), context(node(healthy_gpu(0), odd)))
        assert status_of(result, 1) is Severity.UNKNOWN, garbage
        assert status_of(result, 0) is Severity.PASS


async def test_subclass_without_judge_is_unknown_per_gpu() -> None:
    class Half(GpuCheck):
        NAME = "half"

    result = await run(Half(), context(node(count=2)))
    assert [status_of(result, i) for i in range(2)] == [Severity.UNKNOWN] * 2


async def test_entities_carry_gpu_identity() -> None:
    gpu = healthy_gpu(4)
    result = await run(RemappedCheck(), context(node(gpu, replace(healthy_gpu(5)))))
    entity = entity_status(result, 4).entity
    assert (entity.uuid, entity.pci_bus_id, entity.model) == (gpu.uuid, gpu.pci_bus_id, gpu.model)
