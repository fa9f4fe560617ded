"""The `pciebw` check: host<->device copy bandwidth per GPU, judged against its link.

A GPU can train its PCIe link at full generation and width and still move data
slowly (a bad riser, a retimer, a mis-set BIOS, a failing switch). This check copies
pinned host memory to and from each GPU, one GPU at a time, and judges each
direction against what the link's CURRENT generation and width can carry: a link
that trained down is the `pcie` check's PCIE_LINK_DEGRADED; here we ask whether the
link delivers what it now promises. The rate the link could carry at its maximum
generation and width is reported as a value beside it.

Theoretical unidirectional rate = GT/s per lane x lanes x encoding efficiency / 8:

    Gen1 2.5 GT/s 8b/10b    Gen2 5 GT/s 8b/10b    Gen3 8 GT/s 128b/130b
    Gen4 16 GT/s 128b/130b  Gen5 32 GT/s 128b/130b
    Gen6 64 GT/s, Gen7 128 GT/s: PAM4 with FLIT encoding, counted 1:1 (the figures
    PCI-SIG publishes, 128 and 256 GB/s at x16; FLIT framing costs a few percent,
    which `min_fraction` absorbs).

The measurement runs in a short-lived child process per GPU (checks.pciebw_probe,
`Probes.bandwidth`), under `probe_timeout_s`: the agent never holds a CUDA context.
A probe error is UNKNOWN for that GPU, a driver that cannot be used at all is
UNKNOWN for the whole check: never a PASS.
"""

from __future__ import annotations

from contextlib import suppress
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from checks.base import (
    AutopilotGauge,
    CheckContext,
    CheckResult,
    Entity,
    Measure,
    ResultBuilder,
    measures,
)
from checks.gpucheck import GpuCheck, gpu_entity, unwrap
from checks.pciebw_probe import ChildBandwidthProbe, ProbeError, ProbeUnavailable, measure_within
from checks.probes import Bandwidth, BandwidthProbe
from checks.snapshot import GpuSnapshot, NodeSnapshot, PcieLink

MIB = 1 << 20

# Generation -> (GT/s per lane, encoding efficiency). See the module docstring.
PCIE_GENERATIONS: dict[int, tuple[float, float]] = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 1.0),
    7: (128.0, 1.0),
}


def link_rate_gbps(gen: int, width: int) -> float:
    """Theoretical unidirectional GB/s of a PCIe link (Gen4 x16 -> 31.5)."""
    if gen not in PCIE_GENERATIONS:
        raise ValueError(f"unknown PCIe generation {gen}")
    if width < 1:
        raise ValueError(f"invalid PCIe link width x{width}")
    gts, encoding = PCIE_GENERATIONS[gen]
    return gts * width * encoding / 8


class PcieBwParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    min_fraction: float = Field(
        0.7, gt=0, le=1, description="pass when both directions reach this share of the link"
    )
    size_mib: int = Field(64, ge=1, le=4096, description="bytes per copy, in MiB")
    iterations: int = Field(5, ge=1, le=100, description="timed copies per direction")
    probe_timeout_s: float = Field(
        30.0, gt=0, le=600, description="one GPU's measurement, child start to answer; "
        "past it the child is killed and the GPU is UNKNOWN")


class PcieBwCheck(GpuCheck[PcieBwParams]):
    NAME: ClassVar[str] = "pciebw"
    DESCRIPTION: ClassVar[str] = (
        "PCIe host<->device copy bandwidth against what the current link can carry"
    )
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        *measures("healthd_gpu_pcie_bandwidth_gbps", "Measured host<->device copy bandwidth "
                  "in GB/s.", "direction", {"h2d": "h2d_gbps", "d2h": "d2h_gbps"}),
        Measure("healthd_gpu_pcie_link_bandwidth_gbps", "GB/s the current PCIe link can carry.",
                "link_gbps"),
    )
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("pciebw", value="h2d_gbps")
    CODES: ClassVar[tuple[str, ...]] = ("PCIE_BW_LOW", "GPU_MISSING")
    Params: ClassVar[type[BaseModel]] = PcieBwParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 3600.0
    INPUTS: ClassVar[frozenset[str] | None] = frozenset({"nvml", "pciebw"})
    DEFAULT_TIMEOUT_S: ClassVar[float] = 120.0  # ~2 s per GPU in its child; slack

    async def run(self, ctx: CheckContext) -> CheckResult:
        try:
            return await super().run(ctx)
        except ProbeUnavailable as exc:
            return CheckResult.unknown(self.NAME, exc.reason)

    async def examine(
        self, snapshot: NodeSnapshot, ctx: CheckContext, builder: ResultBuilder
    ) -> None:
        probe = self._probe()
        for gpu in snapshot.gpus:
            entity = gpu_entity(gpu)
            if gpu.lost:
                self.lost(gpu, entity, builder)
            elif gpu.mig_enabled:
                builder.skip(entity, "MIG enabled: the whole GPU cannot be measured")
                builder.seen(entity, mig=True)
            else:
                await self._examine_gpu(probe, gpu, entity, builder)

    def _probe(self) -> BandwidthProbe:
        given = self.probes.bandwidth
        if isinstance(given, BandwidthProbe):
            return given
        if given is not None:
            raise ProbeUnavailable(f"bandwidth probe {type(given).__name__} has no measure()")
        return ChildBandwidthProbe()

    async def _examine_gpu(
        self, probe: BandwidthProbe, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder
    ) -> None:
        builder.seen(entity)
        link = unwrap(gpu.pcie, "PCIe link", entity, builder)
        if link is not None and not _describe_link(link, entity, builder):
            link = None
        measured = await self._measure(probe, gpu, entity, builder)
        if measured is None:
            return
        builder.seen(entity, h2d_gbps=_r(measured.h2d_gbps), d2h_gbps=_r(measured.d2h_gbps))
        if link is not None:
            self._judge_bandwidth(measured, link, entity, builder)

    async def _measure(
        self, probe: BandwidthProbe, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder
    ) -> Bandwidth | None:
        size = self.settings.size_mib * MIB
        try:
            measured = await measure_within(probe, gpu.pci_bus_id, size, self.settings.iterations,
                                            self.settings.probe_timeout_s)
        except ProbeUnavailable:
            raise
        except ProbeError as exc:
            builder.unknown(entity, exc.reason)
            return None
        except Exception as exc:  # a broken probe costs only this GPU
            builder.unknown(entity, f"measurement failed: {type(exc).__name__}: {exc}")
            return None
        if not _plausible(measured):
            builder.unknown(entity, f"measurement returned nonsense: {measured!r}")
            return None
        return measured

    def _judge_bandwidth(
        self, measured: Bandwidth, link: PcieLink, entity: Entity, builder: ResultBuilder
    ) -> None:
        rate = link_rate_gbps(link.gen, link.width)
        expected = self.settings.min_fraction * rate
        directions = {"H2D": measured.h2d_gbps, "D2H": measured.d2h_gbps}
        if all(value >= expected for value in directions.values()):
            return
        shown = ", ".join(
            f"{name} {value:.1f} GB/s{' (low)' if value < expected else ''}"
            for name, value in directions.items()
        )
        builder.finding(
            "PCIE_BW_LOW",
            entity,
            f"{shown}: expected >= {expected:.1f} GB/s per direction "
            f"({self.settings.min_fraction:.0%} of Gen{link.gen} x{link.width}, {rate:.1f} GB/s)",
            h2d_gbps=_r(measured.h2d_gbps),
            d2h_gbps=_r(measured.d2h_gbps),
            expected_h2d_gbps=_r(expected),
            expected_d2h_gbps=_r(expected),
            link_gbps=_r(rate),
        )


def _describe_link(link: PcieLink, entity: Entity, builder: ResultBuilder) -> bool:
    """Record the link's rates as values; False (and UNKNOWN) when they make no sense."""
    try:
        current = link_rate_gbps(link.gen, link.width)
    except ValueError as exc:
        builder.unknown(entity, f"PCIe link Gen{link.gen} x{link.width}: {exc}")
        return False
    builder.seen(entity, link_gen=link.gen, link_width=link.width, link_gbps=_r(current))
    with suppress(ValueError):  # the maximum is reported, never judged: an odd one costs nothing
        builder.seen(entity, max_link_gbps=_r(link_rate_gbps(link.max_gen, link.max_width)))
    return True


def _plausible(measured: object) -> bool:
    return isinstance(measured, Bandwidth) and all(
        isinstance(v, int | float) and 0 < v < float("inf")
        for v in (measured.h2d_gbps, measured.d2h_gbps)
    )


def _r(value: float) -> float:
    return round(value, 2)
