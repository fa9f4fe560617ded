"""The `pcie` check: PCIe link width and generation against the maximum, and the
replay counter's rise between runs, per GPU.

Link: a GPU trained below its maximum width or generation moves data slower than
the node was bought for -> PCIE_LINK_DEGRADED ("PCIe Gen3 x8, capable of Gen5 x16").
The maximum compared against is what the GPU and its slot can both do (NVML's max
link), so a Gen4 board in a Gen4 slot is never flagged for not being Gen5.

Idle false positive: NVIDIA GPUs drop the link generation while idle to save power
(the link returns to full speed under load), so an idle GPU often reads Gen1. With
`ignore_idle_gen_drop` (the default) a generation drop on a GPU whose clock event
reasons say "idle" is not a finding; the value `idle_gen_drop` shows it. A width
drop is never a power saving measure and is always reported. A link truly stuck at
a low generation shows as soon as the GPU works (and in the `pciebw` measurement).

Replays: the replay counter counts link-level retransmissions since driver load. A
few are normal; a steadily rising counter means a marginal link (riser, cable,
slot). Each check instance keeps the last counter per GPU UUID and reports
PCIE_REPLAYS when it rose by more than `max_replay_rise` since the previous run.
The default, 8 per run, matches DCGM's PCIe health watch (more than 8 replays a
minute) at the default 30 s interval with room to spare. The first run only records
a baseline; a counter that went down (driver reload, GPU reset) starts a new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from checks.base import Entity, Measure, ResultBuilder, measures
from checks.gpucheck import GpuCheck, unwrap
from checks.power import GPU_IDLE
from checks.probes import Probes
from checks.snapshot import GpuSnapshot, Ok, PcieLink


class PcieParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_replay_rise: int = Field(
        8, ge=0, description="replays tolerated between two consecutive runs (0: any rise)"
    )
    ignore_idle_gen_drop: bool = Field(
        True, description="an idle GPU's lower link generation is power saving, not a fault"
    )


class PcieCheck(GpuCheck[PcieParams]):
    NAME: ClassVar[str] = "pcie"
    DESCRIPTION: ClassVar[str] = (
        "PCIe link generation and width below the maximum; replay counter rising"
    )
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        *measures("healthd_gpu_pcie_link_generation", "PCIe link generation.", "link",
                  {"current": "pcie_gen", "max": "pcie_max_gen"}),
        *measures("healthd_gpu_pcie_link_width", "PCIe link width in lanes.", "link",
                  {"current": "pcie_width", "max": "pcie_max_width"}),
    )
    CODES: ClassVar[tuple[str, ...]] = ("PCIE_LINK_DEGRADED", "PCIE_REPLAYS", "GPU_MISSING")
    Params: ClassVar[type[BaseModel]] = PcieParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0


    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None, *,
                 probes: Probes | None = None) -> None:
        super().__init__(params, probes=probes)
        self._replays: dict[str, int] = {}  # last counter per GPU UUID

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        self._judge_replays(gpu, entity, builder)
        link = unwrap(gpu.pcie, "PCIe link", entity, builder)
        if link is not None:
            self._judge_link(gpu, link, entity, builder)

    def _judge_link(
        self, gpu: GpuSnapshot, link: PcieLink, entity: Entity, builder: ResultBuilder
    ) -> None:
        builder.seen(
            entity,
            pcie_gen=link.gen,
            pcie_width=link.width,
            pcie_max_gen=link.max_gen,
            pcie_max_width=link.max_width,
        )
        gen_low = link.gen < link.max_gen
        if gen_low and self.settings.ignore_idle_gen_drop and _idle(gpu):
            builder.seen(entity, idle_gen_drop=True)
            gen_low = False
        if gen_low or link.width < link.max_width:
            builder.finding(
                "PCIE_LINK_DEGRADED",
                entity,
                f"PCIe Gen{link.gen} x{link.width}, capable of Gen{link.max_gen} x{link.max_width}",
            )

    def _judge_replays(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        count = unwrap(gpu.pcie_replays, "PCIe replay counter", entity, builder, optional=True)
        if count is None:
            return
        key = gpu.uuid or gpu.pci_bus_id or f"gpu{gpu.index}"
        previous = self._replays.get(key)
        self._replays[key] = count
        builder.seen(entity, pcie_replays=count)
        if previous is None or count < previous:
            return  # first sight, or the counter was reset: a new baseline
        rise = count - previous
        builder.seen(entity, pcie_replay_rise=rise)
        if rise > self.settings.max_replay_rise:
            builder.finding(
                "PCIE_REPLAYS",
                entity,
                f"PCIe replay counter rose by {rise} since the last run "
                f"(now {count}, tolerated {self.settings.max_replay_rise})",
            )


def _idle(gpu: GpuSnapshot) -> bool:
    reasons = gpu.clock_event_reasons
    return isinstance(reasons, Ok) and bool(reasons.value & GPU_IDLE)
