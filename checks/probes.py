"""What checks measure with besides their own logic: the protocols of every stand-in a
check can be given, the plain values those stand-ins hand back, and `Probes`, the
one frozen value that groups them.

A check gets its stand-ins when it is built (`BaseCheck(params, probes=...)`), never
through the per-round context: the agent, `healthd check`, `healthd record` and the
simulator each build their checks with the probes they have. A field left None is
the real thing, which the check that uses it opens itself (netlink, ICMP, the CUDA
driver in a child process, NVML, sysfs, the clock since boot).

The real implementations live beside the check that uses them (`checks.nic`'s
`NetlinkReader`, `checks.ping`'s `IcmpProber`, `checks.pciebw_probe`'s
`ChildBandwidthProbe`, `checks.nvml_reader`'s `NvmlReader`, `checks.rdma`'s
`SysfsRdmaReader`, `checks.aer`'s `SysfsAerReader`, `checks.kernel_log`'s
`KernelLog`, `checks.snapshot`'s `NvmlGpuSource`), or in healthd (the pvc check's
API, the node's GPU pods:
Kubernetes API). A check that needs a new stand-in adds its protocol and a `Probes`
field here and reads it in its own module: the check contract (checks.base) does
not change.

This module runs on the standard library alone and imports no check: the
snapshot's types appear in annotations only (an import-linter contract keeps it so).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # the NVML snapshot's values, for annotations only
    from checks.snapshot import GpuSnapshot, NodeSnapshot, XidEvent


# -- the GPUs: one NVML pass per round ------------------------------------------------


class GpuSource(Protocol):
    """What a round's context serves the NVML checks: one snapshot per round, and XID
    events (`checks.snapshot.NvmlGpuSource` is the real one)."""

    async def snapshot(self) -> NodeSnapshot:
        """The snapshot of the current round (read once, then served from cache)."""
        ...

    async def xid_events(self, window_s: float) -> list[XidEvent]:
        """XID events received during the next `window_s` seconds (or already queued)."""
        ...


# -- links of secondary interfaces (the nic check) ------------------------------------


@dataclass(frozen=True)
class LinkState:
    """What netlink (and sysfs) say about one interface."""

    interface: str
    admin_up: bool
    operstate: str  # UP, DOWN, LOWERLAYERDOWN, UNKNOWN, ...
    carrier: bool
    carrier_changes: int
    mtu: int
    counters: Mapping[str, int] = field(default_factory=dict)  # rx/tx errors and drops
    speed_mbps: int | None = None  # None when the driver does not say

    @property
    def up(self) -> bool:
        # Virtual links without operstate support report UNKNOWN while working.
        return self.admin_up and self.carrier and self.operstate in ("UP", "UNKNOWN")


class LinkReader(Protocol):
    """Reads the named interfaces; an interface that does not exist is left out."""

    async def read(self, interfaces: Sequence[str]) -> Mapping[str, LinkState]: ...


# -- host<->device bandwidth (the pciebw check) ---------------------------------------


@dataclass(frozen=True)
class Bandwidth:
    """Measured copy bandwidth in GB/s, each direction; `pid`: the process that made
    the copies (0: not known), which NVML may still list on the GPU just after."""

    h2d_gbps: float
    d2h_gbps: float
    pid: int = 0


@runtime_checkable
class BandwidthProbe(Protocol):
    """Measures host<->device bandwidth of one GPU (`checks.pciebw_probe`'s child
    process is the real one). The check awaits it one GPU at a time, under a
    deadline: cancelled, it must leave nothing running."""

    async def measure(self, pci_bus_id: str, size_bytes: int, iterations: int) -> Bandwidth: ...


@dataclass(frozen=True)
class GpuActivity:
    """What NVML says is using one GPU now (checks.busy judges it): the processes
    holding a context on it, compute and graphics (`pids`; None: NVML could not list
    them), and the bytes its PCIe link carries per second, as KB/s over NVML's 20 ms
    sample: received by the GPU (`rx_kbps`, host-to-device) and sent (`tx_kbps`);
    None: unreadable. `problem` says what could not be read."""

    pids: tuple[int, ...] | None
    rx_kbps: int | None
    tx_kbps: int | None
    problem: str = ""


class ActivityReader(Protocol):
    """Reads a GPU's activity by its PCI bus id (`checks.nvml_reader.NvmlReader` is
    the real one). Blocking: the check calls it in a worker thread."""

    def activity(self, pci_bus_id: str) -> GpuActivity: ...

    def hold(self) -> AbstractContextManager[str]:
        """Keeps the GPUs from being let go for a GPU reset while a measurement
        touches them: enters with "" (held for the block), or with why the GPUs may
        not be touched now (NVML's owner let go of them; nothing is held). Never
        blocks."""
        ...


GpuPods = Callable[[], Awaitable[Sequence[str]]]
"""The pods on this node that hold GPUs (`namespace/name`); raises when it cannot
tell. healthd lists them through the Kubernetes API (healthd.kube.pods)."""


# -- ICMP echo (the ping check) --------------------------------------------------------


@dataclass(frozen=True)
class Echo:
    """What probing one address gave: requests sent and round-trip times received."""

    address: str
    sent: int
    rtts_ms: tuple[float, ...] = ()

    @property
    def reachable(self) -> bool:
        return bool(self.rtts_ms)

    @property
    def loss(self) -> float:
        """Fraction of requests unanswered; 1.0 when none could even be sent."""
        if self.sent <= 0:
            return 1.0
        return max(0.0, 1.0 - len(self.rtts_ms) / self.sent)


class Prober(Protocol):
    """Sends ICMP echo requests to one address. Raises `checks.ping.ProbeError` (or
    its ProbePermissionError) when it cannot probe; never for a silent peer."""

    async def probe(
        self, address: str, *, count: int, interval_s: float, timeout_s: float
    ) -> Echo: ...


# -- RDMA ports (the rdma check) -------------------------------------------------------


@dataclass(frozen=True)
class RdmaPort:
    """One port of one RDMA device, as sysfs shows it."""

    device: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str  # LinkUp, Disabled, Polling, ...
    link_layer: str  # InfiniBand, Ethernet
    rate_gbps: float | None
    counters: Mapping[str, int] = field(default_factory=dict)
    netdevs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"


class RdmaReader(Protocol):
    """Reads every RDMA port (`checks.rdma.RdmaUnavailable` when it cannot)."""

    def read(self) -> list[RdmaPort]: ...


# -- PCIe AER counters (the aer check) -------------------------------------------------

AerKind = Literal["correctable", "nonfatal", "fatal"]
AER_KINDS: tuple[AerKind, ...] = ("correctable", "nonfatal", "fatal")
# The line the kernel ends each aer_dev_* file with: the count of error messages.
AER_TOTALS: dict[AerKind, str] = {"correctable": "TOTAL_ERR_COR",
                                  "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}


@dataclass(frozen=True)
class AerCounters:
    """One PCI function's AER counters as sysfs lists them, per kind: each named counter
    (`RxErr`, `CmpltTO`, `SDES`, ...) and the kernel's `TOTAL_ERR_*` line."""

    kinds: Mapping[AerKind, Mapping[str, int]]

    def total(self, kind: AerKind) -> int:
        """The kind's TOTAL_ERR_* line (the sum of its counters where there is none)."""
        counts = self.kinds.get(kind, {})
        total = counts.get(AER_TOTALS[kind])
        return total if total is not None else sum(counts.values())

    def named(self, kind: AerKind) -> dict[str, int]:
        """The kind's named counters, without the total."""
        return {k: v for k, v in self.kinds.get(kind, {}).items() if k != AER_TOTALS[kind]}


@dataclass(frozen=True)
class PciPath:
    """A GPU's PCI function and the bridges above it up to its root port, by sysfs
    address, nearest first (`devices[0]` is the GPU), with the AER counters of each
    that has them; `unreadable` says why the others have none. `missing` says why the
    GPU's own device is not there at all (then nothing else is set)."""

    devices: tuple[str, ...] = ()
    counters: Mapping[str, AerCounters] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)
    missing: str = ""


class AerReader(Protocol):
    """Reads the PCI path of each GPU (by sysfs address, `0000:18:00.0`); a device
    that cannot be read is data (`PciPath.missing`, `unreadable`), never an error."""

    def read(self, devices: Sequence[str]) -> Mapping[str, PciPath]: ...


# -- the kernel log (the xid and sxid checks) ------------------------------------------

Kind = Literal["xid", "sxid"]


@dataclass(frozen=True)
class LoggedXid:
    """An XID line: the GPU's PCI address as the driver prints it (domain:bus:device)."""

    xid: int
    pci: str
    seq: int
    usec: int
    message: str


@dataclass(frozen=True)
class LoggedSxid:
    """An SXID line: which NVSwitch (`nvidia-nvswitch3`), its PCI address, the code,
    whether the driver called it fatal, and the NVLink port when it names one."""

    sxid: int
    switch: str
    pci: str
    fatal: bool
    link: int | None
    seq: int
    usec: int
    message: str


Logged = LoggedXid | LoggedSxid


class KernelLogSource(Protocol):
    """What the xid and sxid checks read the kernel log through
    (`checks.kernel_log.KernelLog` is the real one)."""

    def take(self, kind: Kind) -> list[Logged]:
        """The XID or SXID records this consumer has not had yet
        (`checks.kernel_log.LogUnavailable` when the log cannot be read)."""
        ...

    def merge_xids(self, nvml: Sequence[XidEvent], logged: Sequence[LoggedXid],
                   gpus: Sequence[GpuSnapshot]) -> list[XidEvent]:
        """NVML's XIDs plus the logged ones NVML did not already report."""
        ...


# -- the cluster (the pvc check) -------------------------------------------------------


class ApiProblem(Exception):
    """A Kubernetes call failed; `str(exc)` is a one-line reason."""


@dataclass(frozen=True)
class StorageClassInfo:
    """What the pvc probe needs to know about a storage class."""

    name: str
    wait_for_first_consumer: bool
    reclaim_policy: str


class ProbeApi(Protocol):
    """The pvc probe's view of the cluster: one namespace, the test objects of one
    node. `checks` never imports healthd nor the Kubernetes client, so healthd
    implements it over its own Kubernetes layer (healthd.kube.pvc_probe).

    The implementation owns the probe objects' labels (the keys are healthd's) and
    translates every failure into one `ApiProblem` whose text is a one-line reason
    fit for an UNKNOWN result: `"<what was being done>: <why it failed>"`. A 404 on
    delete is success (the object is already gone); a missing storage class is
    `None`, so the check can tell "not found" from "cannot ask"."""

    async def storage_class(self, name: str) -> StorageClassInfo | None:
        """The storage class, or None when it does not exist."""
        ...

    async def create_pvc(self, manifest: Mapping[str, Any], storage_class: str
                         ) -> tuple[str, str]:
        """Create the PVC, labelled as this node's probe; return its resourceVersion
        (where a watch starts) and uid."""
        ...

    async def create_pod(self, manifest: Mapping[str, Any], storage_class: str) -> None:
        """Create the consumer pod, labelled as this node's probe."""
        ...

    async def wait_bound(self, name: str, resource_version: str) -> None:
        """Return once the PVC is Bound, watching it (never polling); the caller sets
        the deadline."""
        ...

    async def provisioning_failure(self, name: str, uid: str = "") -> str | None:
        """The message of the newest ProvisioningFailed event about the PVC, if any."""
        ...

    async def delete_probe(self, name: str, *, pod: bool) -> None:
        """Delete the consumer pod (first: it holds the PVC) and the PVC; a missing
        object is fine. Both are attempted even when one fails."""
        ...

    async def sweep(self) -> int:
        """Delete every probe pod and PVC of this node (leftovers of earlier runs);
        return how many there were."""
        ...


ProbeApiFactory = Callable[[str, str], ProbeApi]
"""(namespace, node) -> the probe's API for that node's test objects there."""


# -- all of them -----------------------------------------------------------------------

Uptime = Callable[[], float]
"""Seconds since the node booted (`checks.base.boot_uptime` is the real clock)."""


@dataclass(frozen=True)
class Probes:
    """The stand-ins checks are built with; None: the real thing (the CUDA bandwidth
    probe, NVML's view of a GPU's activity, netlink, ICMP, the boot clock, sysfs), or,
    for the kernel log, the pvc API and the node's GPU pods, nothing: the check says it
    cannot tell rather than invent a result."""

    bandwidth: BandwidthProbe | None = None  # pciebw
    gpu_activity: ActivityReader | None = None  # pciebw: NVML, read around each copy
    gpu_pods: GpuPods | None = None  # pciebw's free_gpus_only: None, not known here
    links: LinkReader | None = None  # nic
    ping: Prober | None = None  # ping
    uptime: Uptime | None = None  # fabric
    kernel_log: KernelLogSource | None = None  # xid, sxid
    rdma: RdmaReader | None = None  # rdma
    aer: AerReader | None = None  # aer
    pvc_api: ProbeApiFactory | None = None  # pvc: the live cluster's API
