"""Hand-built NVML snapshots and a tiny GpuSource double for the NVML check tests.

The double sits at our own seam (checks.snapshot.GpuSource): unit tests judge exactly
the snapshot they describe. End-to-end tests use the fake NVML library under the
real pynvml instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from checks.base import (
    Check,
    CheckContext,
    CheckResult,
    Entity,
    EntityStatus,
    Finding,
    Severity,
    run_check,
)
from checks.catalog import Catalog, Override
from checks.snapshot import (
    Ecc,
    GpuSnapshot,
    NodeSnapshot,
    NvLink,
    Ok,
    PcieLink,
    Power,
    RemappedRows,
    XidEvent,
)

MODEL = "NVIDIA H100 80GB HBM3"


def healthy_gpu(index: int, **changes: Any) -> GpuSnapshot:
    """A healthy H100 as one NVML pass reads it; `changes` replace fields."""
    gpu = GpuSnapshot(
        index=index,
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        model=MODEL,
        remapped=Ok(RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False)),
        clock_event_reasons=Ok(0),
        power=Ok(Power(usage_w=95.0, limit_w=700.0)),
        pcie=Ok(PcieLink(gen=5, width=16, max_gen=5, max_width=16)),
        pcie_replays=Ok(0),
        ecc=Ok(Ecc(corrected_volatile=0, uncorrected_volatile=0)),
        nvlinks=Ok(tuple(NvLink(link=n, up=True) for n in range(18))),
    )
    return replace(gpu, **changes)


def node(*gpus: GpuSnapshot, count: int = 0, **changes: Any) -> NodeSnapshot:
    """A snapshot of the given GPUs, or of `count` healthy ones."""
    listed = gpus or tuple(healthy_gpu(i) for i in range(count))
    return NodeSnapshot(driver_version="580.65.06", gpus=listed, **changes)


@dataclass
class FakeGpus:
    """A GpuSource that serves given snapshots (one per call, the last one repeated)
    and given XID events; it records the windows it was asked for."""

    snapshots: list[NodeSnapshot]
    events: list[XidEvent] = field(default_factory=list)
    windows: list[float] = field(default_factory=list)

    async def snapshot(self) -> NodeSnapshot:
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]

    async def xid_events(self, window_s: float) -> list[XidEvent]:
        self.windows.append(window_s)
        return list(self.events)


def context(
    *snapshots: NodeSnapshot,
    events: list[XidEvent] | None = None,
    overrides: dict[str, Override] | None = None,
    **fields: Any,
) -> CheckContext:
    """A check context whose GPUs serve `snapshots` in turn."""
    gpus = FakeGpus(list(snapshots), list(events or []))
    return CheckContext(catalog=Catalog(overrides), gpus=gpus, **fields)


async def run(check: Check, ctx: CheckContext) -> CheckResult:
    """Run through the same entry point the agent and CLI use."""
    return await run_check(check, ctx)


def status_of(result: CheckResult, index: int) -> Severity:
    return entity_status(result, index).status


def entity_status(result: CheckResult, index: int) -> EntityStatus:
    matches = [e for e in result.entities if e.entity.kind == "gpu" and e.entity.index == index]
    assert len(matches) == 1, f"gpu{index} reported {len(matches)} times: {result.entities}"
    return matches[0]


def findings_on(result: CheckResult, index: int) -> list[Finding]:
    return [f for f in result.findings if f.entity.index == index and f.entity.kind == "gpu"]


def codes_by_gpu(result: CheckResult) -> dict[int | None, list[str]]:
    """{gpu index: [codes]} for every finding, to assert 'exactly this GPU'."""
    out: dict[int | None, list[str]] = {}
    for f in result.findings:
        out.setdefault(f.entity.index, []).append(f.code)
    return out


def gpu_entity_of(gpu: GpuSnapshot) -> Entity:
    return Entity.gpu(gpu.index, gpu.uuid, gpu.pci_bus_id, gpu.model)
