"""NVML event sets of the fake library: which XID events each set receives, and when.

Two sources of XIDs, two delivery rules:

- `FakeNvml.emit_xid()` is a live NVML event: it reaches every set registered for
  XIDs on that GPU at that moment, and no set created later.
- XIDs scheduled in the machine spec (`xid: [{code, at}]`) describe the machine's
  history: once the injectable clock passes `at`, every set registered for XIDs on
  that GPU receives the event once, even a set registered after `at` (as the kernel
  log keeps an XID for a checker that starts late). Specs therefore do not race
  with how fast the program under test starts.

The owner (healthd.sim.fakenvml) guards all of this with its lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
# What an H100 reports from nvmlDeviceGetSupportedEventTypes (nvml.h bits): single-
# and double-bit ECC, P-state, XID, clock, power source, MIG config change.
SUPPORTED_EVENT_TYPES = 0x1 | 0x2 | 0x4 | XID_CRITICAL_ERROR | 0x10 | 0x80 | 0x100


@dataclass(frozen=True)
class ScheduledXid:
    """An XID the spec (or a test) schedules on a GPU (spec index) at time `at`."""

    key: tuple[int, int]  # stable identity: (id of the fault, position in its list)
    gpu: int
    code: int
    at: float


@dataclass(frozen=True)
class Delivered:
    """One event handed to a waiter: the GPU (spec index), type bits and XID."""

    gpu: int
    event_type: int
    data: int


@dataclass
class EventSet:
    """One nvmlEventSet: the GPUs registered on it (spec index -> event type mask)
    and the events waiting to be read."""

    handle: int
    registered: dict[int, int] = field(default_factory=dict)
    queue: deque[Delivered] = field(default_factory=deque)
    delivered: set[tuple[int, int]] = field(default_factory=set)

    def register(self, gpu: int, mask: int) -> None:
        self.registered[gpu] = self.registered.get(gpu, 0) | mask

    def wants_xid(self, gpu: int) -> bool:
        return bool(self.registered.get(gpu, 0) & XID_CRITICAL_ERROR)

    def collect_due(self, scheduled: Iterable[ScheduledXid], now: float) -> None:
        """Queue every scheduled XID that has happened and that this set should see."""
        due = sorted(
            (x for x in scheduled if x.at <= now and x.key not in self.delivered
             and self.wants_xid(x.gpu)),
            key=lambda x: x.at,
        )
        for xid in due:
            self.delivered.add(xid.key)
            self.queue.append(Delivered(xid.gpu, XID_CRITICAL_ERROR, xid.code))

    def next_due(self, scheduled: Iterable[ScheduledXid]) -> float | None:
        """When the earliest scheduled XID this set still waits for falls due."""
        return min((x.at for x in scheduled if x.key not in self.delivered
                    and self.wants_xid(x.gpu)), default=None)

    def next_event(self) -> Delivered | None:
        return self.queue.popleft() if self.queue else None
