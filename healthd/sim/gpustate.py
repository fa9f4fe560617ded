"""What one simulated GPU looks like at one instant: the machine spec's defaults with
the faults active at that time merged on top.

The fake NVML library (healthd.sim.fakenvml) asks this module for a `GpuState` on
every call, so a fault that starts at `at` and ends at `until` shows up and goes
away exactly when the (injectable) clock says so. Keeping the merge rules here, apart
from the ctypes plumbing, makes them easy to read and to document:

- a fault is active while `at <= t < until` (no `until`: for ever);
- several active faults on one GPU: flags (`lost`, `missing`, `mig`) are OR-ed, MIG
  GPU instances are the most any of them has, lists (clock event reasons, NVLinks
  down) are joined, field errors are merged over the machine's, and for the
  structured fields (remapped rows, power, PCIe link, ECC, bandwidth, recovery
  action, busy) the fault listed last wins;
- the PCIe replay counter is a monotonic counter: it rises at `pcie_replay_rate`
  from `at` and keeps its last value after `until` (a counter never goes back).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pynvml

from healthd.sim.machine import (
    BusyFault,
    ClockReason,
    EccFault,
    FabricSpec,
    GpuFault,
    MachineSpec,
    PowerSpec,
    RemappedRowsFault,
)

# nvmlClocksEventReason bits (nvml.h), by the spec's names.
CLOCK_REASON_BITS: dict[ClockReason, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
SUPPORTED_CLOCK_REASONS = sum(CLOCK_REASON_BITS.values())
# A healthy idle GPU reports only "idle", as real H100s do.
IDLE_REASONS = CLOCK_REASON_BITS["gpu_idle"]
_NO_REMAPS = RemappedRowsFault()
_NO_ECC_ERRORS = EccFault()
_DEFAULT_POWER = PowerSpec()


@dataclass(frozen=True)
class GpuState:
    """Everything the fake NVML library serves about one GPU at one instant."""

    index: int  # position in the spec (the minor number), not the NVML index
    uuid: str
    pci_bus_id: str
    model: str
    memory_mib: int
    ecc_enabled: bool
    mig_capable: bool
    page_retirement: bool
    nvlink_count: int
    lost: bool = False
    missing: bool = False
    mig: bool = False
    gpu_instances: int = 0  # MIG GPU instances (only in MIG mode)
    remapped: RemappedRowsFault = _NO_REMAPS
    clock_reasons: int = IDLE_REASONS
    power: PowerSpec = _DEFAULT_POWER
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    pcie_replays: int = 0
    ecc: EccFault = _NO_ECC_ERRORS
    nvlinks_down: frozenset[int] = field(default_factory=frozenset)
    fabric: FabricSpec | None = None  # None: no NVLink fabric (NOT_SUPPORTED)
    recovery_action: int = pynvml.NVML_GPU_RECOVERY_ACTION_NONE  # NVML field 230
    field_errors: Mapping[int, str] = field(default_factory=dict)  # field id -> NVML error
    busy: BusyFault | None = None  # another workload's processes and PCIe traffic


def is_active(fault: GpuFault, t: float) -> bool:
    """Whether `fault` is in force `t` seconds after the machine started."""
    return fault.at <= t and (fault.until is None or t < fault.until)


def replay_count(faults: Iterable[GpuFault], t: float) -> int:
    """The PCIe replay counter at `t`: monotonic, so faults that ended still count."""
    total = 0.0
    for fault in faults:
        if t < fault.at or (fault.pcie_replays is None and not fault.pcie_replay_rate):
            continue
        end = t if fault.until is None else min(t, fault.until)
        total += (fault.pcie_replays or 0) + fault.pcie_replay_rate * (end - fault.at)
    return int(total)


def gpu_state(spec: MachineSpec, faults: Sequence[GpuFault], index: int, t: float) -> GpuState:
    """The state of GPU `index` (spec position) at `t`, given the faults on it."""
    gpus = spec.gpus
    state = GpuState(
        index=index,
        uuid=spec.uuid(index),
        pci_bus_id=spec.pci_bus_id(index),
        model=gpus.model,
        memory_mib=gpus.memory_mib,
        ecc_enabled=gpus.ecc_enabled,
        mig_capable=gpus.mig_capable,
        page_retirement=gpus.page_retirement,
        nvlink_count=gpus.nvlinks,
        power=gpus.power,
        pcie_gen=gpus.pcie.gen,
        pcie_width=gpus.pcie.width,
        pcie_max_gen=gpus.pcie.max_gen or gpus.pcie.gen,
        pcie_max_width=gpus.pcie.max_width or gpus.pcie.width,
        pcie_replays=replay_count(faults, t),
        fabric=spec.fabric,
        field_errors=gpus.field_errors,
    )
    active = [f for f in faults if is_active(f, t)]
    return _merge(state, active) if active else state


def _merge(state: GpuState, active: Sequence[GpuFault]) -> GpuState:
    changes: dict[str, object] = {
        "lost": any(f.lost for f in active),
        "missing": any(f.missing for f in active),
        "mig": state.mig_capable and any(f.mig for f in active),
        "gpu_instances": max((f.gpu_instances for f in active if state.mig_capable), default=0),
        "nvlinks_down": frozenset(link for f in active for link in f.nvlink_down),
        "field_errors": {**state.field_errors,
                         **{k: v for f in active for k, v in f.field_errors.items()}},
    }
    reasons = [r for f in active for r in f.clock_event_reasons]
    if reasons:
        changes["clock_reasons"] = _reason_mask(reasons)
    masks = [f.clock_event_mask for f in active if f.clock_event_mask is not None]
    if masks:  # an exact mask (a recording) replaces named reasons
        changes["clock_reasons"] = masks[-1]
    for fault in active:  # the last fault listed wins for structured fields
        if fault.remapped_rows is not None:
            changes["remapped"] = fault.remapped_rows
        if fault.power is not None:
            changes["power"] = fault.power
        if fault.ecc is not None:
            changes["ecc"] = fault.ecc
        if fault.busy is not None:
            changes["busy"] = fault.busy
        if fault.fabric is not None and state.fabric is not None:
            changes["fabric"] = state.fabric.model_copy(
                update=fault.fabric.model_dump(exclude_none=True))
        if fault.recovery_action is not None:
            changes["recovery_action"] = recovery_number(fault.recovery_action)
        if fault.pcie is not None:
            changes["pcie_gen"] = fault.pcie.gen or state.pcie_gen
            changes["pcie_width"] = fault.pcie.width or state.pcie_width
            changes["pcie_max_gen"] = fault.pcie.max_gen or state.pcie_max_gen
            changes["pcie_max_width"] = fault.pcie.max_width or state.pcie_max_width
    return replace(state, **changes)  # type: ignore[arg-type]


def recovery_number(action: str | int) -> int:
    """NVML's number for a recovery action named in a spec (`GPU_RESET` -> 1)."""
    if isinstance(action, int):
        return action
    return int(getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{action}"))


def _reason_mask(reasons: Iterable[ClockReason]) -> int:
    mask = 0
    for reason in reasons:
        mask |= CLOCK_REASON_BITS[reason]
    return mask
