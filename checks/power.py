"""The `power` check: hardware clock slowdowns, plus power draw and limit, per GPU.

NVML's clock event reasons (formerly "throttle reasons") say why clocks are below
their maximum. Most reasons are normal operation: idle, the software power cap,
application clock settings, sync boost, software thermal control. Three come from
hardware protection and mean the GPU cannot deliver its rated speed: HW slowdown,
HW thermal slowdown and HW power brake -> HW_SLOWDOWN, with the reasons named.
Reading the bitmask (and falling back to the older NVML call) is the access
layer's job; this module only judges it.
"""

from __future__ import annotations

from typing import ClassVar

from checks.base import AutopilotGauge, Entity, Measure, NoParams, ResultBuilder
from checks.gpucheck import GpuCheck, unwrap
from checks.snapshot import GpuSnapshot

# nvmlClocksEventReason* bits (nvml.h), named as the machine spec names them.
CLOCK_EVENT_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
GPU_IDLE = 0x1
HW_SLOWDOWN_MASK = 0x8 | 0x40 | 0x80


def clock_event_names(mask: int) -> list[str]:
    """The named reasons set in `mask`, lowest bit first; unknown bits as hex."""
    names = [name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit]
    unnamed = mask & ~sum(CLOCK_EVENT_BITS)
    if unnamed:
        names.append(f"0x{unnamed:x}")
    return names


class PowerCheck(GpuCheck[NoParams]):
    NAME: ClassVar[str] = "power"
    DESCRIPTION: ClassVar[str] = (
        "hardware clock slowdowns (HW slowdown, thermal, power brake); power draw and limit"
    )
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_gpu_power_watts", "GPU power draw in watts.", "power_w"),
        Measure("healthd_gpu_power_limit_watts", "GPU power limit in watts.", "limit_w"),
    )
    # Autopilot calls this check `power-slowdown`.
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("power-slowdown")
    CODES: ClassVar[tuple[str, ...]] = ("HW_SLOWDOWN", "GPU_MISSING")
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        power = unwrap(gpu.power, "power", entity, builder, optional=True)
        if power is not None:
            builder.seen(entity, power_w=round(power.usage_w, 1), limit_w=round(power.limit_w, 1))
        mask = unwrap(gpu.clock_event_reasons, "clock event reasons", entity, builder)
        if mask is None:
            return
        builder.seen(entity, clock_events=",".join(clock_event_names(mask)))
        hardware = clock_event_names(mask & HW_SLOWDOWN_MASK)
        if hardware:
            reasons = ",".join(hardware)
            builder.finding(
                "HW_SLOWDOWN",
                entity,
                f"clocks held down by hardware: {', '.join(hardware)}",
                reasons=reasons,
            )
