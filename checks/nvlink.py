"""The `nvlink` check: NVLinks that exist but are down, per GPU.

NVML reports each of a GPU's NVLinks as up or down; a link that exists and is down
cuts GPU-to-GPU bandwidth (and can hang collectives) -> NVLINK_DOWN naming the
links. GPUs without NVLink (NVML says NotSupported, or no link exists) are SKIPPED.
"""

from __future__ import annotations

from typing import ClassVar

from checks.base import Entity, NoParams, ResultBuilder
from checks.gpucheck import GpuCheck, unwrap
from checks.snapshot import GpuSnapshot


class NvlinkCheck(GpuCheck[NoParams]):
    NAME: ClassVar[str] = "nvlink"
    DESCRIPTION: ClassVar[str] = "NVLinks that exist and are down"
    CODES: ClassVar[tuple[str, ...]] = ("NVLINK_DOWN", "GPU_MISSING")
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        links = unwrap(gpu.nvlinks, "NVLink", entity, builder)
        if links is None:
            return
        if not links:
            builder.skip(entity, "NVLink: no links")
            return
        down = sorted(link.link for link in links if not link.up)
        builder.seen(entity, nvlinks_up=len(links) - len(down), nvlinks=len(links))
        if down:
            names = ", ".join(str(n) for n in down)
            plural = "s" if len(down) > 1 else ""
            builder.finding(
                "NVLINK_DOWN",
                entity,
                f"NVLink{plural} {names} down ({len(links) - len(down)} of {len(links)} up)",
                nvlinks_down=names,
            )
