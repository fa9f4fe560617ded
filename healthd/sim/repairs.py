"""What a repair does to a simulated GPU's faults, as it does to a real GPU.

- A GPU reset (`nvidia-smi --gpu-reset`): a pending row remap takes effect (the rows
  stay remapped), pending retired pages retire, the volatile ECC counts start again
  from zero, and a recovery action the driver asked a reset for is done. It cannot
  bring back a GPU that fell off the bus or was never enumerated (the reset fails),
  nor undo a failed remap (the bank is out of spare rows).
- A reboot: everything volatile goes (XID aftermath, a lost GPU back on the bus, the
  driver's recovery action, ECC counts, link and clock states); what the GPU keeps in
  its InfoROM stays: remapped rows and a remap failure.
- A fault marked `hardware: true` survives both, unchanged: a broken GPU comes back.

Only faults in force at the moment of the repair change; one scheduled for later
still happens.
"""

from __future__ import annotations

from healthd.sim.machine import EccFault, GpuFault, RemappedRowsFault

# Recovery actions a GPU reset carries out (nvmlGpuRecoveryAction_t), by name and number.
_RESET_ACTIONS = {"GPU_RESET", "BUS_RESET", "DRAIN_AND_RESET", 1, 4, 6}


def resettable(fault: GpuFault) -> bool:
    """Whether a reset can reach the GPU at all under `fault` (not lost, enumerated)."""
    return not (fault.lost or fault.missing)


def after_reset(fault: GpuFault) -> GpuFault:
    """`fault` once its GPU was reset (see the module docstring)."""
    if fault.hardware or not resettable(fault):
        return fault
    changes: dict[str, object] = {}
    if fault.remapped_rows is not None and fault.remapped_rows.pending:
        changes["remapped_rows"] = fault.remapped_rows.model_copy(update={"pending": False})
    if fault.ecc is not None:
        changes["ecc"] = EccFault()
    if fault.recovery_action in _RESET_ACTIONS:
        changes["recovery_action"] = None
    return fault.model_copy(update=changes)


def after_reboot(fault: GpuFault) -> GpuFault | None:
    """`fault` after the node rebooted; None when nothing of it is left."""
    if fault.hardware:
        return fault
    rows = fault.remapped_rows
    if rows is None or not (rows.correctable or rows.uncorrectable or rows.failure):
        return None
    kept = RemappedRowsFault(correctable=rows.correctable, uncorrectable=rows.uncorrectable,
                             failure=rows.failure)
    return GpuFault(gpu=fault.gpu, at=fault.at, until=fault.until, remapped_rows=kept)
