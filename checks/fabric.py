"""The `fabric` check: is every GPU registered in its NVLink fabric?

On NVSwitch systems (HGX, DGX) the Fabric Manager registers each GPU in the fabric
at boot; until it has, NVML still calls the GPU fine, but CUDA refuses multi-GPU
work ("system not yet initialized") and NCCL falls back to slow paths. NVML reports
the registration per GPU (nvmlDeviceGetGpuFabricInfoV, read in the one NVML pass):

- state `completed` with a status other than SUCCESS -> FABRIC_REGISTRATION_FAILED;
- state `not_started` -> FABRIC_NOT_STARTED, `in_progress` -> FABRIC_IN_PROGRESS,
  once the node has been up longer than `grace_s` (the Fabric Manager registers
  every GPU within seconds of starting at boot; before that, it is simply early);
- no fabric (PCIe boards: NVML says NotSupported) -> SKIPPED.

The grace is measured from boot, not from the agent's start, so a restarted agent or
a one-shot `healthd check` judges at once what has been late for long.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from checks.base import CheckContext, Entity, Measure, ResultBuilder, boot_uptime
from checks.gpucheck import GpuCheck, unwrap
from checks.snapshot import GpuSnapshot, NodeSnapshot

_LATE = {"not_started": "FABRIC_NOT_STARTED", "in_progress": "FABRIC_IN_PROGRESS"}
_WHAT = {"not_started": "has not started registering", "in_progress": "is still registering"}


class FabricParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    grace_s: float = Field(
        300.0, ge=0, description="seconds after boot before an unregistered GPU is a fault")


class FabricCheck(GpuCheck[FabricParams]):
    NAME: ClassVar[str] = "fabric"
    DESCRIPTION: ClassVar[str] = "NVLink fabric registration of every GPU (NVSwitch systems)"
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_gpu_fabric_registered", "1 when the GPU is registered in its NVLink "
                "fabric (NVSwitch systems).", "fabric_registered"),
    )
    CODES: ClassVar[tuple[str, ...]] = (
        "FABRIC_NOT_STARTED", "FABRIC_IN_PROGRESS", "FABRIC_REGISTRATION_FAILED", "GPU_MISSING")
    Params: ClassVar[type[BaseModel]] = FabricParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0

    _uptime_s: float = 0.0

    async def examine(self, snapshot: NodeSnapshot, ctx: CheckContext,
                      builder: ResultBuilder) -> None:
        self._uptime_s = (self.probes.uptime or boot_uptime)()
        await super().examine(snapshot, ctx, builder)

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        fabric = unwrap(gpu.fabric, "NVLink fabric", entity, builder)
        if fabric is None:
            return
        registered = fabric.state == "completed" and fabric.status == "SUCCESS"
        values: dict[str, int | str] = {"fabric_state": fabric.state,
                                        "fabric_status": fabric.status,
                                        "clique_id": fabric.clique_id,
                                        "fabric_registered": int(registered)}
        builder.seen(entity, **values)
        if fabric.state == "completed":
            if fabric.status != "SUCCESS":
                builder.finding("FABRIC_REGISTRATION_FAILED", entity,
                                f"the Fabric Manager failed to register the GPU in the NVLink "
                                f"fabric: {fabric.status}", **values)
            return
        if self._uptime_s >= self.settings.grace_s:
            builder.finding(_LATE[fabric.state], entity,
                            f"the Fabric Manager {_WHAT[fabric.state]} the GPU in the NVLink "
                            f"fabric, more than {self.settings.grace_s:g} s after boot: "
                            "multi-GPU work cannot run", **values)
