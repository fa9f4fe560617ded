"""The simulated machine spec: a YAML description of a GPU node and its faults.

This is a public interface (tests, the demo, benchmarks and users write it); the
format is documented in docs/machine-spec.md. The fake NVML library
(healthd.sim.fakenvml) serves exactly what a spec describes, underneath the real
pynvml. Every fault may start `at` seconds after the machine starts and end at
`until`, so a spec can describe faults that appear and go away mid-run.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from checks.aer import sysfs_address
from healthd.sim.dcgm import DcgmSim
from healthd.util import bundled
from healthd.util.models import Frozen
from healthd.util.validation import explain

ClockReason = Literal[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
]

# NVML error names a spec may inject (NVML_ERROR_<NAME> in nvml.h).
NvmlErrorName = Literal[
    "UNINITIALIZED",
    "INVALID_ARGUMENT",
    "NOT_SUPPORTED",
    "NO_PERMISSION",
    "NOT_FOUND",
    "INSUFFICIENT_POWER",
    "DRIVER_NOT_LOADED",
    "TIMEOUT",
    "IRQ_ISSUE",
    "LIBRARY_NOT_FOUND",
    "FUNCTION_NOT_FOUND",
    "CORRUPTED_INFOROM",
    "GPU_IS_LOST",
    "RESET_REQUIRED",
    "OPERATING_SYSTEM",
    "LIB_RM_VERSION_MISMATCH",
    "MEMORY",
    "UNKNOWN",
    # newer codes, so a recording can replay whatever a driver answered
    "ALREADY_INITIALIZED",
    "INSUFFICIENT_SIZE",
    "IN_USE",
    "NO_DATA",
    "VGPU_ECC_NOT_SUPPORTED",
    "INSUFFICIENT_RESOURCES",
    "FREQ_NOT_SUPPORTED",
    "ARGUMENT_VERSION_MISMATCH",
    "DEPRECATED",
    "NOT_READY",
    "GPU_NOT_FOUND",
    "INVALID_STATE",
    "RESET_TYPE_NOT_SUPPORTED",
]


FabricStateName = Literal["not_started", "in_progress", "completed"]

# What the driver may ask for a GPU (NVML field 230; NVML_GPU_RECOVERY_ACTION_<NAME>).
RecoveryActionName = Literal["NONE", "GPU_RESET", "NODE_REBOOT", "DRAIN_P2P", "DRAIN_AND_RESET",
                             "RECOVER_IMEX_DOMAIN", "BUS_RESET", "SYSTEM_REBOOT"]
# A field's own answer in nvmlDeviceGetFieldValues, by field id (230: the recovery action).
FieldErrors = dict[Annotated[int, Field(ge=0, le=2**32 - 1)], NvmlErrorName]


class FabricSpec(Frozen):
    """An NVLink fabric (HGX/DGX boards with NVSwitches): what NVML's fabric info
    (nvmlDeviceGetGpuFabricInfoV) says for every GPU unless a fault says otherwise.
    No `fabric` section: a PCIe board, the call answers NOT_SUPPORTED."""

    state: FabricStateName = Field("completed", description="the Fabric Manager's registration")
    status: Literal["SUCCESS"] | NvmlErrorName = Field(
        "SUCCESS", description="the registration's outcome, as an NVML return code name")
    clique_id: int = Field(0, ge=0, le=2**32 - 1)
    cluster_uuid: str = Field("", pattern=r"^([0-9a-f]{32})?$",
                              description="32 hex digits; empty: all zero")


class FabricFault(Frozen):
    """One GPU's fabric registration; unset fields keep the machine's."""

    state: FabricStateName | None = None
    status: Literal["SUCCESS"] | NvmlErrorName | None = None


class RdmaPortSpec(Frozen):
    """One RDMA port as sysfs shows it; unset fields take the `rdma` section's."""

    device: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="e.g. mlx5_3")
    port: int = Field(1, ge=1, le=16)
    state: str = Field("ACTIVE", pattern=r"^[A-Z_]+$",
                       description="ACTIVE, DOWN, INIT, ARMED, ACTIVE_DEFER")
    phys_state: str = Field("LinkUp", pattern=r"^[A-Za-z ]+$",
                            description="LinkUp, Disabled, Polling, Sleep, ...")
    rate_gbps: float | None = Field(None, gt=0)
    link_layer: Literal["InfiniBand", "Ethernet"] | None = None
    netdev: str | None = Field(None, description="its network interface (unset: none)")
    counters: dict[str, int] = Field({}, description="error counters, e.g. symbol_error: 3")


class RdmaSpec(Frozen):
    """The node's RDMA NICs, written as a fake /sys/class/infiniband tree: `devices`
    single-port devices mlx5_0.. (netdevs net1.., the names Multus gives secondary
    interfaces), plus `ports` that override or add ports."""

    devices: int = Field(0, ge=0, le=64)
    link_layer: Literal["InfiniBand", "Ethernet"] = "Ethernet"
    rate_gbps: float = Field(400.0, gt=0)
    ports: list[RdmaPortSpec] = []


AerCount = Annotated[int, Field(ge=0)]
# A counter's name as the kernel prints it in aer_dev_* (`RxErr`, `CmpltTO`, `SDES`, ...).
AerName = Annotated[str, Field(pattern=r"^[!-~]([ -~]*[!-~])?$")]


class AerCounts(Frozen):
    """One PCI function's AER counters, per kind, by the kernel's names; each kind's
    `TOTAL_ERR_*` line is their sum unless given."""

    correctable: dict[AerName, AerCount] = {}
    nonfatal: dict[AerName, AerCount] = {}
    fatal: dict[AerName, AerCount] = {}


class AerFault(AerCounts):
    """PCIe errors on one GPU's PCI path, added to the counters from the fault's `at`
    on (they never go back, so `until` does not take them away)."""

    level: int = Field(0, ge=0, description="0: the GPU's own function; 1: the bridge "
                       "right above it; ...; the last: its root port")


class AerSpec(Frozen):
    """The PCI tree under the GPUs and its AER counters, written as a fake
    /sys/bus/pci/devices: each GPU below the bridges `upstream` names (unset: a PCIe
    switch's downstream and upstream ports and a root port, on the three buses below
    the GPU's), with `counts` since boot; `supported: false` or `without_aer`: no
    aer_dev_* files (AER off, or a device without the capability)."""

    supported: bool = True
    upstream: dict[Annotated[int, Field(ge=0)], list[str]] = Field(
        {}, description="GPU position -> its bridges by sysfs address, nearest first")
    counts: dict[str, AerCounts] = Field({}, description="sysfs address -> counters")
    without_aer: list[str] = Field([], description="sysfs addresses without AER counters")


class PcieSpec(Frozen):
    gen: int = Field(5, ge=1, le=7)
    width: int = Field(16, ge=1, le=32)
    max_gen: int | None = Field(None, ge=1, le=7, description="defaults to gen")
    max_width: int | None = Field(None, ge=1, le=32, description="defaults to width")


class PcieLinkFault(Frozen):
    """Link state of one GPU; unset fields keep the GPU's values."""

    gen: int | None = Field(None, ge=1, le=7)
    width: int | None = Field(None, ge=1, le=32)
    max_gen: int | None = Field(None, ge=1, le=7)
    max_width: int | None = Field(None, ge=1, le=32)


class PowerSpec(Frozen):
    usage_w: float = Field(95.0, ge=0)
    limit_w: float = Field(700.0, gt=0)


class BandwidthSpec(Frozen):
    """Host<->device copy bandwidth the simulated pciebw measurement reports (GB/s).
    Unset: what the current link carries at a healthy 85% efficiency."""

    h2d: float | None = Field(None, gt=0)
    d2h: float | None = Field(None, gt=0)


class BusyFault(Frozen):
    """Another workload on the GPU, as NVML shows it: the processes holding a context
    on it, and the PCIe traffic it makes. The simulated copy probe shares the link
    with that traffic, so it measures less."""

    processes: int = Field(1, ge=0, le=64, description="processes NVML lists on the GPU")
    pcie_rx_gbps: float = Field(0.0, ge=0, description="host-to-device traffic, GB/s")
    pcie_tx_gbps: float = Field(0.0, ge=0, description="device-to-host traffic, GB/s")


class GpuDefaults(Frozen):
    count: int = Field(8, ge=0, le=64)
    model: str = "NVIDIA H100 80GB HBM3"
    uuids: list[str] | None = Field(None, description="one per GPU; generated when unset")
    pci_bus_ids: list[str] | None = Field(
        None, description="one per GPU; 00000000:18:00.0, 00000000:28:00.0, ... when unset")
    pcie: PcieSpec = PcieSpec()
    power: PowerSpec = PowerSpec()
    nvlinks: int = Field(18, ge=0, le=18, description="NVLinks per GPU; 0 = no NVLink")
    ecc_enabled: bool = True
    memory_mib: int = Field(81559, ge=1)
    mig_capable: bool = Field(True, description="false: MIG queries return NOT_SUPPORTED")
    page_retirement: bool = Field(
        False,
        description="true: pre-Ampere page retirement (V100); Ampere and later remap rows "
        "instead, and retired-page queries return NOT_SUPPORTED",
    )
    pcie_bandwidth_gbps: BandwidthSpec = BandwidthSpec()
    unsupported: list[str] = Field(
        [],
        description="NVML device functions every GPU answers NOT_SUPPORTED (as some "
        "virtual machines do for clock event reasons or NVLink)",
    )
    field_errors: FieldErrors = Field(
        {}, description="NVML fields every GPU answers with this error in "
        "nvmlDeviceGetFieldValues (230 NOT_SUPPORTED: a driver older than the recovery action)")
    persistence_mode: bool = Field(
        True, description="persistence mode at boot (nvidia-persistenced turns it on on most "
        "GPU nodes); it counts as a client, so a GPU reset is refused while it is on")
    reset_alone: bool | None = Field(
        None, description="whether one GPU can be reset by itself; false: only all the "
        "machine's GPUs together. Unset: from the architecture (see MachineSpec.resets_alone)")

    @field_validator("unsupported")
    @classmethod
    def _nvml_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(r"nvml[A-Za-z0-9_]+", name):
                raise ValueError(f"{name!r} is not an NVML function name (nvmlDeviceGet...)")
        return names


class RemappedRowsFault(Frozen):
    correctable: int = Field(0, ge=0)
    uncorrectable: int = Field(0, ge=0)
    pending: bool = False
    failure: bool = False


class EccFault(Frozen):
    corrected_volatile: int = Field(0, ge=0)
    uncorrected_volatile: int = Field(0, ge=0)
    retired_pages_pending: bool = False


class XidSpec(Frozen):
    code: int = Field(ge=1, le=0xFFFF)
    at: float = Field(0.0, ge=0, description="seconds after machine start")


class NvmlErrorSpec(Frozen):
    function: str = Field(pattern=r"^nvml[A-Za-z0-9_]+$")
    error: NvmlErrorName
    times: int | None = Field(None, ge=1, description="fail this many calls, then recover")


class GpuFault(Frozen):
    """Faults on one GPU. Active from `at` until `until` seconds after start."""

    gpu: int = Field(ge=0)
    at: float = Field(0.0, ge=0)
    until: float | None = Field(None, gt=0)
    remapped_rows: RemappedRowsFault | None = None
    clock_event_reasons: list[ClockReason] = []
    clock_event_mask: int | None = Field(
        None, ge=0, le=2**64 - 1,
        description="the exact reason bit mask (recordings); replaces the named reasons")
    power: PowerSpec | None = None
    pcie: PcieLinkFault | None = None
    pcie_replays: int | None = Field(None, ge=0, description="replay counter value")
    pcie_replay_rate: float = Field(0.0, ge=0, description="replay counter rise per second")
    pcie_bandwidth_gbps: BandwidthSpec | None = None
    busy: BusyFault | None = Field(None, description="another workload uses the GPU")
    ecc: EccFault | None = None
    nvlink_down: list[int] = []
    lost: bool = Field(False, description="every call on this GPU returns GPU_IS_LOST")
    missing: bool = Field(False, description="the GPU is not enumerated at all")
    mig: bool = False
    gpu_instances: int = Field(0, ge=0, le=7, description="MIG GPU instances on the GPU "
                               "(needs mig: true); a GPU that has any cannot be reset")
    xid: list[XidSpec] = []
    fabric: FabricFault | None = None
    aer: list[AerFault] = Field([], description="PCIe AER errors on the GPU's path from `at`")
    recovery_action: RecoveryActionName | Annotated[int, Field(ge=0, le=2**32 - 1)] | None = \
        Field(None, description="what the driver asks for the GPU (NVML field 230): a name, "
              "or NVML's number for one newer than the names")
    field_errors: FieldErrors = Field(
        {}, description="this GPU's answers in nvmlDeviceGetFieldValues, by field id")
    nvml_errors: list[NvmlErrorSpec] = []
    hardware: bool = Field(False, description="the fault survives GPU resets and reboots "
                           "(broken hardware); otherwise a repair clears what it clears "
                           "on a real GPU (healthd.sim.repairs)")

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> GpuFault:
        _check_window(self.at, self.until)
        if self.gpu_instances and not self.mig:
            raise ValueError("gpu_instances needs mig: true (GPU instances exist only in MIG mode)")
        return self


def _check_window(at: float, until: float | None) -> None:
    if until is not None and until <= at:
        raise ValueError(f"until ({until:g} s) must be after at ({at:g} s)")


class HolderSpec(Frozen):
    """A host process outside Kubernetes that keeps GPUs open (nv-hostengine, a
    monitoring daemon) from `at` until `until` seconds after the machine starts: a
    GPU reset is refused while it holds the GPU (healthd.sim.holders)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.:/-]{1,63}$", description="its process name")
    gpus: list[Annotated[int, Field(ge=0)]] | Literal["all"] = Field(
        "all", description="the GPUs it holds, by position; all: every GPU")
    at: float = Field(0.0, ge=0)
    until: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> HolderSpec:
        _check_window(self.at, self.until)
        return self


# GPUs that cannot be reset alone (NVIDIA's rule, as NVSentinel's reset design records
# it): before Ampere, those NVLink joins; on A100 NVSwitch boards, every GPU (the reset
# takes the switches with it). Hopper and later reset one GPU even on NVSwitch.
_PRE_AMPERE = re.compile(r"\b(V100|P100|Tesla [KMP]\d+)", re.IGNORECASE)
_AMPERE_SXM = re.compile(r"\bA100\b", re.IGNORECASE)


class MachineSpec(Frozen):
    """A simulated GPU node."""

    node: str = Field("sim-node", min_length=1)
    driver_present: bool = Field(True, description="false: NVML library not found")
    driver_version: str = "580.65.06"
    cuda_driver_version: int = 13000
    gpus: GpuDefaults = GpuDefaults()
    fabric: FabricSpec | None = Field(None, description="an NVSwitch fabric; unset: none")
    uptime_s: float = Field(
        3600.0, ge=0, description="seconds since the node booted when the machine starts")
    faults: list[GpuFault] = []
    holders: list[HolderSpec] = Field(
        [], description="host processes that keep GPUs open (a GPU reset is refused meanwhile)")
    rdma: RdmaSpec | None = Field(None, description="RDMA NICs; unset: none")
    aer: AerSpec = Field(AerSpec(), description="the GPUs' PCI tree and its AER counters")
    kernel_log: list[str] | None = Field(
        None, description="kernel-log messages written before the machine starts, in order "
        "(XID and SXID lines); unset: a log without NVIDIA lines")
    dcgm: DcgmSim = Field(DcgmSim(), description="what the fake dcgmi answers")
    recorded: list[str] | None = Field(
        None,
        description="a recording: the sources it holds (nvml, xid, pciebw, dcgm, "
        "kernel_log, rdma, aer); "
        "a check that reads anything else replays as SKIPPED 'not recorded'. Unset: "
        "not a recording, everything is simulated",
    )

    def holds(self, source: str) -> bool:
        """Whether the machine has `source` to serve: a recording only what it holds."""
        return self.recorded is None or source in self.recorded

    def resets_alone(self) -> bool:
        """Whether one GPU can be reset by itself: `gpus.reset_alone` when given; else
        not on an A100 NVSwitch board (`fabric`) nor on pre-Ampere GPUs joined by NVLink
        (a V100 model, or `page_retirement`), only all the GPUs together; else alone."""
        gpus = self.gpus
        if gpus.reset_alone is not None:
            return gpus.reset_alone
        if _AMPERE_SXM.search(gpus.model) and self.fabric is not None:
            return False
        pre_ampere = gpus.page_retirement or _PRE_AMPERE.search(gpus.model) is not None
        return not (pre_ampere and gpus.nvlinks > 0)

    @model_validator(mode="after")
    def _faults_name_real_gpus(self) -> MachineSpec:
        for fault in self.faults:
            if fault.gpu >= self.gpus.count:
                raise ValueError(
                    f"fault names gpu {fault.gpu} but the machine has {self.gpus.count} "
                    f"GPUs (indices 0..{self.gpus.count - 1})"
                )
            if fault.ecc is not None and fault.ecc.retired_pages_pending \
                    and not self.gpus.page_retirement:
                raise ValueError(
                    f"gpu {fault.gpu}: ecc.retired_pages_pending needs gpus.page_retirement: "
                    "true (Ampere and later GPUs remap rows instead of retiring pages)"
                )
            if fault.mig and not self.gpus.mig_capable:
                raise ValueError(f"gpu {fault.gpu}: mig: true needs gpus.mig_capable: true")
            if fault.fabric is not None and self.fabric is None:
                raise ValueError(f"gpu {fault.gpu}: fabric needs a machine-wide fabric "
                                 "section (an NVSwitch system)")
            for link in fault.nvlink_down:
                if link >= self.gpus.nvlinks:
                    raise ValueError(
                        f"gpu {fault.gpu}: nvlink_down names link {link} but GPUs have "
                        f"{self.gpus.nvlinks} links"
                    )
            for error in fault.aer:
                if error.level > len(self.pci_upstream(fault.gpu)):
                    raise ValueError(
                        f"gpu {fault.gpu}: aer level {error.level} but the GPU has "
                        f"{len(self.pci_upstream(fault.gpu))} bridges above it")
        for holder in self.holders:
            named = [] if holder.gpus == "all" else holder.gpus
            if any(gpu >= self.gpus.count for gpu in named):
                raise ValueError(f"holder {holder.name!r} names gpus {named} but the machine "
                                 f"has {self.gpus.count} GPUs")
        for field in ("uuids", "pci_bus_ids"):
            given = getattr(self.gpus, field)
            if given is not None and len(given) != self.gpus.count:
                raise ValueError(f"gpus.{field} has {len(given)} entries, count is "
                                 f"{self.gpus.count}")
        return self

    def uuid(self, index: int) -> str:
        """The GPU's UUID: from the spec, or stable per node name and index."""
        if self.gpus.uuids is not None:
            return self.gpus.uuids[index]
        digest = hashlib.sha1(f"{self.node}/{index}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"

    def pci_bus_id(self, index: int) -> str:
        if self.gpus.pci_bus_ids is not None:
            return self.gpus.pci_bus_ids[index]
        # Real H100 boxes spread GPUs over buses like this; only uniqueness matters.
        return f"00000000:{0x18 + 0x10 * index:02X}:00.0"

    def pci_upstream(self, index: int) -> list[str]:
        """The bridges above GPU `index` up to its root port, nearest first, by sysfs
        address: `aer.upstream`'s, or generated on the three buses below the GPU's (a
        GPU on bus 0..2 sits on the root bus, with none)."""
        if index in self.aer.upstream:
            return self.aer.upstream[index]
        address = sysfs_address(self.pci_bus_id(index))
        if not address:  # a GPU recorded without a bus id (missing)
            return []
        domain, bus_hex, _device = address.split(":")
        bus = int(bus_hex, 16)
        if bus < 3:
            return []
        return [f"{domain}:{bus - 1:02x}:00.0", f"{domain}:{bus - 2:02x}:00.0",
                f"{domain}:{bus - 3:02x}:01.0"]

    @model_validator(mode="after")
    def _one_pci_tree(self) -> MachineSpec:
        """Every device has one parent: generated bridges that land on another GPU or
        on another GPU's bridges (GPUs on neighbouring buses) need `aer.upstream`."""
        for index in self.aer.upstream:
            if index >= self.gpus.count:
                raise ValueError(f"aer.upstream names gpu {index} but the machine has "
                                 f"{self.gpus.count} GPUs")
        parents: dict[str, str] = {}
        addresses = [sysfs_address(self.pci_bus_id(i)) for i in range(self.gpus.count)]
        gpus = set(addresses) - {""}
        for index, address in enumerate(addresses):
            if not address:
                continue
            chain = [address, *self.pci_upstream(index)]
            for child, parent in zip(chain, [*chain[1:], ""], strict=True):
                if parent in gpus:
                    raise ValueError(f"gpu {index}: its bridge {parent} is another GPU; give "
                                     "each GPU's bridges in aer.upstream")
                if parents.setdefault(child, parent) != parent:
                    raise ValueError(
                        f"gpu {index}: PCI device {child} would sit below both "
                        f"{parents[child] or 'the root bus'} and {parent or 'the root bus'}; "
                        "give each GPU's bridges in aer.upstream")
        return self

    def faults_for(self, index: int) -> list[GpuFault]:
        return [f for f in self.faults if f.gpu == index]


class MachineSpecError(ValueError):
    """A machine spec that cannot be used; the message names the field and the fix."""


def load_machine_spec(source: str | Path) -> MachineSpec:
    """Read a machine spec from a YAML file (or a bundled name such as `healthy-8xh100`)."""
    try:
        path, raw = bundled.read_yaml(source, BUNDLED_DIR, "machine spec")
    except bundled.UnreadableFile as exc:
        raise MachineSpecError(str(exc)) from exc
    return parse_machine_spec(raw, origin=str(path))


def parse_machine_spec(raw: object, origin: str = "<spec>") -> MachineSpec:
    if not isinstance(raw, dict):
        raise MachineSpecError(f"machine spec {origin}: expected a mapping at the top level")
    try:
        return MachineSpec.model_validate(raw)
    except RecursionError:
        raise MachineSpecError(f"machine spec {origin}: nested too deeply") from None
    except ValidationError as exc:
        raise MachineSpecError(f"machine spec {origin}: {explain(exc)}") from exc


BUNDLED_DIR = Path(__file__).parent / "machines"


def bundled_specs() -> list[str]:
    """Names of the example specs shipped with healthd."""
    return bundled.names(BUNDLED_DIR)


def resolve_bundled(source: str | Path) -> Path:
    """A path as given, or a bundled spec by name (`remap-pending`)."""
    return bundled.resolve(source, BUNDLED_DIR)
