"""Builders for the metrics tests: check results as the real checks shape them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from checks.base import CheckResult, Entity, ResultBuilder, Severity
from checks.catalog import Catalog
from healthd.agent.metrics import AgentMetrics

NODE = "gpu-node-7"
MODEL = "NVIDIA H100 80GB HBM3"


def gpu(index: int) -> Entity:
    return Entity.gpu(index, f"GPU-{index:04d}", f"00000000:{index + 0x10:02X}:00.0", MODEL)


def gpu_labels(index: int) -> dict[str, str]:
    entity = gpu(index)
    return {
        "node": NODE,
        "gpu": str(index),
        "UUID": entity.uuid,
        "pci_bus_id": entity.pci_bus_id,
        "modelName": MODEL,
    }


def builder(check: str) -> ResultBuilder:
    return ResultBuilder(check, Catalog())


def stamped(
    result: CheckResult, started_at: float = 1000.0, duration_s: float = 0.2
) -> CheckResult:
    return result.timed(started_at, duration_s)


def pciebw(rates: dict[int, float], low: tuple[int, ...] = ()) -> CheckResult:
    b = builder("pciebw")
    for index, h2d in rates.items():
        b.seen(gpu(index), h2d_gbps=h2d, d2h_gbps=h2d + 1, link_gbps=63.0)
        if index in low:
            b.finding("PCIE_BW_LOW", gpu(index), f"GPU {index} copies at {h2d} GB/s")
    return stamped(b.build())


def remapped(gpus: range, pending: tuple[int, ...] = ()) -> CheckResult:
    b = builder("remapped")
    for index in gpus:
        rows = 1 if index in pending else 0
        b.seen(gpu(index), correctable=0, uncorrectable=rows, pending=bool(rows), failure=False)
        if rows:
            b.finding("REMAP_PENDING", gpu(index), "row remapping pending")
    return stamped(b.build())


def status_of(result: CheckResult, entity: Entity) -> Severity:
    return next(s.status for s in result.entities if s.entity == entity)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> AgentMetrics:
    return AgentMetrics(
        registry, node=NODE, cpu_model="AMD EPYC 9654", gpu_model=MODEL, clock=lambda: 5000.0
    )
