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

While NVML's owner has let go of the GPUs for a GPU reset (checks.nvml_reader's
`release`), nothing is measured: the snapshot says so (UNKNOWN), and a run that began
before finds each remaining GPU refused (UNKNOWN); a copy in flight holds the GPUs
(`hold`), so the release waits for it.

Never a finding from a disturbed measurement (checks.busy): NVML is asked what uses
the GPU before the copy (a busy GPU is not measured at all, so the job is not
disturbed either) and after it (a GPU that became busy meanwhile: the measurement is
discarded). Either way the GPU is SKIPPED "busy: <evidence>; not judged". A busy GPU
is tried again within the run, `busy_retry_s` later, then twice that, up to
`busy_retries` times while the run's deadline leaves room; a GPU still busy waits
for the next scheduled run. Each GPU's row carries `last_judged`, when this check
last judged a measurement of it, so a GPU that stays busy for a day shows; the value
is `kept`, so the agent's metric is the latest of every run's (an on-demand run's
check starts with no memory of its own, and never erases the periodic one's). With
`free_gpus_only`, nothing is measured while any pod on the node holds a GPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import replace
from typing import Any, ClassVar

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from checks.base import (
    AutopilotGauge,
    CheckContext,
    CheckResult,
    Entity,
    Measure,
    ResultBuilder,
    Severity,
    measures,
)
from checks.busy import Assessment, assess
from checks.gpucheck import GpuCheck, gpu_entity, unwrap
from checks.nvml_reader import NvmlReader
from checks.pciebw_probe import ChildBandwidthProbe, ProbeError, ProbeUnavailable, measure_within
from checks.probes import ActivityReader, Bandwidth, BandwidthProbe, GpuActivity, Probes
from checks.snapshot import GpuSnapshot, NodeSnapshot, PcieLink

MIB = 1 << 20
NOT_JUDGED = "no GPU judged (each GPU's row says why)"

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
    busy_gbps: float = Field(
        1.0, gt=0, description="PCIe traffic of others, in either direction, that makes a "
        "GPU busy (not judged)")
    busy_retries: int = Field(
        2, ge=0, le=10, description="times a busy GPU is tried again within one run")
    busy_retry_s: float = Field(
        10.0, ge=0, le=600, description="wait before the first try again; doubles each time")
    free_gpus_only: bool = Field(
        False, description="measure nothing while any pod on the node holds a GPU (pods "
        "do not say which GPU they hold)")


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
        Measure("healthd_gpu_pcie_bandwidth_last_judged_timestamp_seconds",
                "When pciebw last judged a measurement of the GPU (Unix time); a busy GPU "
                "is not judged.", "last_judged", kept=True),
    )
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("pciebw", value="h2d_gbps")
    CODES: ClassVar[tuple[str, ...]] = ("PCIE_BW_LOW", "GPU_MISSING")
    Params: ClassVar[type[BaseModel]] = PcieBwParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 3600.0
    INPUTS: ClassVar[frozenset[str] | None] = frozenset({"nvml", "pciebw"})
    # ~2 s per GPU in its child, plus the busy retries' waits (10 + 20 s by default)
    DEFAULT_TIMEOUT_S: ClassVar[float] = 120.0

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None, *,
                 probes: Probes | None = None) -> None:
        super().__init__(params, probes=probes)
        self._nvml: NvmlReader | None = None  # opened on first use, kept across runs
        self._last_judged: dict[str, float] = {}  # GPU UUID -> when last judged

    async def run(self, ctx: CheckContext) -> CheckResult:
        try:
            result = await super().run(ctx)
        except ProbeUnavailable as exc:
            return CheckResult.unknown(self.NAME, exc.reason)
        if result.status is Severity.SKIPPED and result.entities and not result.reason:
            return replace(result, reason=NOT_JUDGED)  # a SKIPPED check says why
        return result

    async def examine(
        self, snapshot: NodeSnapshot, ctx: CheckContext, builder: ResultBuilder
    ) -> None:
        probe = self._probe()
        holders = await self._gpu_holders()
        links: dict[int, PcieLink | None] = {}
        for gpu in snapshot.gpus:
            entity = gpu_entity(gpu)
            if gpu.lost:
                self.lost(gpu, entity, builder)
            elif gpu.mig_enabled:
                builder.skip(entity, "MIG enabled: the whole GPU cannot be measured")
                builder.seen(entity, mig=True)
            elif holders:
                builder.skip(entity, f"{holders}; not measured (free_gpus_only)")
            else:
                links[gpu.index] = self._link(gpu, entity, builder)
        busy = await self._measure_while_idle(
            probe, [g for g in snapshot.gpus if g.index in links], links, builder)
        for gpu, seen in busy:
            self._skip_busy(gpu, seen, builder)
        for gpu in snapshot.gpus:
            self._report_last_judged(gpu, builder)

    # -- the stand-ins --------------------------------------------------------------

    def _probe(self) -> BandwidthProbe:
        given = self.probes.bandwidth
        if isinstance(given, BandwidthProbe):
            return given
        if given is not None:
            raise ProbeUnavailable(f"bandwidth probe {type(given).__name__} has no measure()")
        return ChildBandwidthProbe()

    def _activity_reader(self) -> ActivityReader:
        if self.probes.gpu_activity is not None:
            return self.probes.gpu_activity
        if self._nvml is None:
            self._nvml = NvmlReader()
        return self._nvml

    async def _activity(self, gpu: GpuSnapshot) -> GpuActivity:
        return await anyio.to_thread.run_sync(self._activity_reader().activity, gpu.pci_bus_id)

    async def _gpu_holders(self) -> str:
        """With free_gpus_only: why nothing may be measured ("" when it may)."""
        if not self.settings.free_gpus_only:
            return ""
        if self.probes.gpu_pods is None:
            return "which pods hold GPUs is not known here"
        try:
            pods: Sequence[str] = await self.probes.gpu_pods()
        except Exception as exc:  # any failure to list: not proven free, so not measured
            return f"cannot list the pods holding GPUs: {exc}"
        if not pods:
            return ""
        shown = ", ".join(list(pods)[:3]) + (", ..." if len(pods) > 3 else "")
        return f"pods hold GPUs on this node ({len(pods)}: {shown})"

    # -- measuring ------------------------------------------------------------------

    def _link(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> PcieLink | None:
        builder.seen(entity)
        link = unwrap(gpu.pcie, "PCIe link", entity, builder)
        if link is not None and not _describe_link(link, entity, builder):
            return None
        return link

    async def _measure_while_idle(
        self, probe: BandwidthProbe, gpus: list[GpuSnapshot],
        links: Mapping[int, PcieLink | None], builder: ResultBuilder,
    ) -> list[tuple[GpuSnapshot, Assessment]]:
        """Measure every GPU; those found busy are tried again after a wait that
        doubles, while the retries and the run's deadline allow. Returns the GPUs still
        busy at the end, with what made them busy."""
        wait = self.settings.busy_retry_s
        busy: list[tuple[GpuSnapshot, Assessment]] = []
        for attempt in range(self.settings.busy_retries + 1):
            if attempt:
                if not self._time_left_for(wait):
                    break
                await anyio.sleep(wait)
                wait *= 2
            busy = []
            for gpu in gpus:
                seen = await self._examine_gpu(probe, gpu, links[gpu.index], builder)
                if seen is not None:
                    busy.append((gpu, seen))
            gpus = [gpu for gpu, _ in busy]
            if not gpus:
                break
        return busy

    def _time_left_for(self, wait: float) -> bool:
        """Whether the run's deadline leaves room to wait and measure once more."""
        deadline = anyio.current_effective_deadline()
        return math.isinf(deadline) or (
            deadline - anyio.current_time() > wait + self.settings.probe_timeout_s)

    async def _examine_gpu(self, probe: BandwidthProbe, gpu: GpuSnapshot,
                           link: PcieLink | None, builder: ResultBuilder) -> Assessment | None:
        """Measure one GPU unless it is busy or let go for a GPU reset (UNKNOWN, not
        touched at all); judge what was measured. The GPUs are held while it runs, so
        a reset waits for the copy. Returns what made the GPU busy (before or during
        the copy), None when it was not."""
        with self._activity_reader().hold() as refused:
            if refused:
                builder.unknown(gpu_entity(gpu), refused)
                return None
            return await self._measure_idle(probe, gpu, link, builder)

    async def _measure_idle(self, probe: BandwidthProbe, gpu: GpuSnapshot,
                            link: PcieLink | None, builder: ResultBuilder) -> Assessment | None:
        before = self._assess(await self._activity(gpu))
        if before.busy:
            return before
        entity = gpu_entity(gpu)
        measured = await self._measure(probe, gpu, entity, builder)
        if measured is None:
            return None
        after = self._assess(await self._activity(gpu), measured.pid)
        if after.busy:
            return after
        builder.seen(entity, h2d_gbps=_r(measured.h2d_gbps), d2h_gbps=_r(measured.d2h_gbps))
        if link is not None:
            unsure = before.unsure or after.unsure
            if self._judge_bandwidth(measured, link, entity, builder, unsure):
                self._last_judged[gpu.uuid or gpu.pci_bus_id] = time.time()
        return None

    def _assess(self, activity: GpuActivity, probe_pid: int = 0) -> Assessment:
        return assess(activity, traffic_gbps=self.settings.busy_gbps, probe_pid=probe_pid)

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

    # -- judging --------------------------------------------------------------------

    def _judge_bandwidth(self, measured: Bandwidth, link: PcieLink, entity: Entity,
                         builder: ResultBuilder, unsure: str) -> bool:
        """PASS or PCIE_BW_LOW; True when judged. A low rate from a GPU NVML could not
        say was idle is not judged: another workload may have shared the link."""
        rate = link_rate_gbps(link.gen, link.width)
        expected = self.settings.min_fraction * rate
        directions = {"H2D": measured.h2d_gbps, "D2H": measured.d2h_gbps}
        if all(value >= expected for value in directions.values()):
            return True
        if unsure:
            builder.skip(entity, f"measured low, but whether another workload shared the link "
                         f"cannot be told ({unsure}); not judged")
            return False
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
        return True

    def _skip_busy(self, gpu: GpuSnapshot, seen: Assessment, builder: ResultBuilder) -> None:
        entity = gpu_entity(gpu)
        builder.skip(entity, f"busy: {seen.evidence()}; not judged")
        builder.seen(entity, other_processes=seen.processes,
                     other_h2d_gbps=_r(seen.h2d_gbps), other_d2h_gbps=_r(seen.d2h_gbps))

    def _report_last_judged(self, gpu: GpuSnapshot, builder: ResultBuilder) -> None:
        when = self._last_judged.get(gpu.uuid or gpu.pci_bus_id)
        if when is not None:
            builder.seen(gpu_entity(gpu), last_judged=when)


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
