"""The one place that talks to NVML, through the real `pynvml` (nvidia-ml-py).

One NVML pass per round: `NvmlReader.read()` walks every GPU once and returns a
`NodeSnapshot` of plain values; the NVML checks judge that snapshot and never call
NVML themselves. NVML outcomes are mapped here, once:

- library or driver missing -> `NodeSnapshot.driver_error` = "NVIDIA driver not found"
  (the checks turn it into UNKNOWN with that one-line reason)
- `NotSupported` for one property -> that reading is `Unsupported` (SKIPPED)
- `GPU_IS_LOST` -> `GpuSnapshot.lost` (the `gpus` check reports GPU_MISSING)
- any other NVML error for a property -> that reading is `Failed` (UNKNOWN)

Blocking NVML calls run in a worker thread (anyio) under the caller's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

DRIVER_NOT_FOUND = "NVIDIA driver not found"


@dataclass(frozen=True)
class Unsupported:
    """NVML says this GPU does not support the property: SKIPPED, not a failure."""

    reason: str = "not supported"


@dataclass(frozen=True)
class Failed:
    """NVML failed to read the property: the check cannot tell (UNKNOWN)."""

    reason: str


@dataclass(frozen=True)
class Ok(Generic[T]):
    value: T


Reading = Ok[T] | Unsupported | Failed


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class PcieLink:
    gen: int
    width: int
    max_gen: int
    max_width: int


@dataclass(frozen=True)
class Power:
    usage_w: float
    limit_w: float


@dataclass(frozen=True)
class Ecc:
    """Volatile (since driver load) ECC error counts."""

    corrected_volatile: int
    uncorrected_volatile: int


@dataclass(frozen=True)
class NvLink:
    link: int
    up: bool


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything one NVML pass read about one GPU. Identity fields are empty when the
    GPU was lost before they could be read."""

    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    model: str = ""
    lost: bool = False
    lost_reason: str = ""
    mig_enabled: bool = False
    remapped: Reading[RemappedRows] = Unsupported()
    clock_event_reasons: Reading[int] = Unsupported()
    power: Reading[Power] = Unsupported()
    pcie: Reading[PcieLink] = Unsupported()
    pcie_replays: Reading[int] = Unsupported()
    ecc: Reading[Ecc] = Unsupported()
    retired_pages_pending: Reading[bool] = Unsupported()
    nvlinks: Reading[tuple[NvLink, ...]] = Unsupported()


@dataclass(frozen=True)
class NodeSnapshot:
    """One NVML pass over the whole node."""

    driver_error: str = ""
    driver_version: str = ""
    nvml_version: str = ""
    gpus: tuple[GpuSnapshot, ...] = ()
    taken_at: float = 0.0
    duration_s: float = 0.0


@dataclass(frozen=True)
class XidEvent:
    """An XID critical error delivered by NVML's event API."""

    xid: int
    gpu_index: int
    uuid: str
    at: float  # time.time() when received


class GpuSource(Protocol):
    """What checks get in their context: one snapshot per round, and XID events."""

    async def snapshot(self) -> NodeSnapshot:
        """The snapshot of the current round (read once, then served from cache)."""
        ...

    async def xid_events(self, window_s: float) -> list[XidEvent]:
        """XID events received during the next `window_s` seconds (or already queued)."""
        ...
