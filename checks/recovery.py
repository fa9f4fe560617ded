"""The `recovery` check: what the NVIDIA driver itself says each GPU needs.

After an uncorrectable fault the driver records the action that brings the GPU back,
and NVML reports it as field 230, `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (read once
per GPU in the round's NVML pass). It is the driver's own verdict, so it catches a
GPU that needs a reset even when the XID that caused it was logged while nobody
listened (the agent was down, or the event was missed):

- NONE: nothing to do (PASS);
- GPU_RESET, BUS_RESET: reset the GPU (or its PCIe bus) once its processes have left;
- DRAIN_P2P: stop every process that uses peer-to-peer traffic; the driver then
  names the next action;
- DRAIN_AND_RESET: drain peer-to-peer traffic, then reset the GPU;
- NODE_REBOOT, SYSTEM_REBOOT: the fault may have left the OS inconsistent: reboot;
- RECOVER_IMEX_DOMAIN: recover the GPU's IMEX (multi-node NVLink) domain;
- a number newer than these: RECOVERY_UNKNOWN_ACTION (WARN) with the number.

Each GPU's row carries the action (`recovery_action`, its NVML number
`recovery_action_code`), exported as `healthd_gpu_recovery_action{action=...}`, so
remediation can act on the driver's word. A driver older than the field answers
NOT_SUPPORTED: that GPU is SKIPPED, never a failure. Why each code has its severity:
docs/checks.md.

A separate check (not part of `xid` or `remapped`): it judges a state read on every
round, which clears by itself once the GPU was reset, where `xid` judges events
seen once; and it can be turned off or overridden alone.
"""

from __future__ import annotations

from typing import ClassVar

from checks.base import Entity, Measure, NoParams, ResultBuilder
from checks.gpucheck import GpuCheck, unwrap
from checks.snapshot import GpuSnapshot

# nvmlDeviceGpuRecoveryAction_t (nvml.h): NVML's number -> its name.
ACTIONS: dict[int, str] = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P",
                           4: "DRAIN_AND_RESET", 5: "RECOVER_IMEX_DOMAIN", 6: "BUS_RESET",
                           7: "SYSTEM_REBOOT"}
# action name -> (finding code, what the driver asks, in a message)
_FINDINGS: dict[str, tuple[str, str]] = {
    "GPU_RESET": ("RECOVERY_GPU_RESET",
                  "a GPU reset: end the GPU's processes, then reset it (nvidia-smi -r)"),
    "BUS_RESET": ("RECOVERY_BUS_RESET",
                  "a reset of the GPU's PCIe bus: end the GPU's processes, then reset it"),
    "DRAIN_P2P": ("RECOVERY_DRAIN_P2P",
                  "a drain of peer-to-peer traffic: end every process using P2P on the "
                  "GPU; the driver then names the next action"),
    "DRAIN_AND_RESET": ("RECOVERY_DRAIN_AND_RESET",
                        "a drain of peer-to-peer traffic, then a GPU reset"),
    "NODE_REBOOT": ("RECOVERY_NODE_REBOOT",
                    "a node reboot: the fault may have left the OS in an inconsistent state"),
    "SYSTEM_REBOOT": ("RECOVERY_SYSTEM_REBOOT", "a system reboot"),
    "RECOVER_IMEX_DOMAIN": ("RECOVERY_IMEX_DOMAIN",
                            "a recovery of the GPU's IMEX (multi-node NVLink) domain"),
}
UNKNOWN_ACTION = "RECOVERY_UNKNOWN_ACTION"


def action_name(number: int) -> str:
    """The action's NVML name, or `UNKNOWN_<n>` for a number newer than healthd."""
    return ACTIONS.get(number, f"UNKNOWN_{number}")


class RecoveryCheck(GpuCheck[NoParams]):
    NAME: ClassVar[str] = "recovery"
    DESCRIPTION: ClassVar[str] = "the recovery action the NVIDIA driver asks for each GPU"
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_gpu_recovery_action", "The recovery action the driver asks for the "
                "GPU: NVML's number (0 none), named by the label action.",
                "recovery_action_code", texts=(("action", "recovery_action"),)),
    )
    CODES: ClassVar[tuple[str, ...]] = (*(code for code, _ in _FINDINGS.values()),
                                        UNKNOWN_ACTION)
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        number = unwrap(gpu.recovery_action, "GPU recovery action", entity, builder)
        if number is None:
            return
        name = action_name(number)
        builder.seen(entity, recovery_action=name, recovery_action_code=number)
        if name == "NONE":
            return
        if name in _FINDINGS:
            code, asked = _FINDINGS[name]
            builder.finding(code, entity, f"the driver asks for {asked}")
            return
        builder.finding(UNKNOWN_ACTION, entity,
                        f"the driver asks for recovery action {number}, which healthd does "
                        "not know")
