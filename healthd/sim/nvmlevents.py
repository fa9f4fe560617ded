"""NVML event sets of the fake library: which XID events each set receives, and when.

One delivery rule, the real library's: an XID reaches the event sets registered for
XIDs on its GPU at the moment it fires, once each, and no set registered later.

- `FakeNvml.emit_xid()` fires now: the sets registered at this moment get it (`fire`).
- An XID scheduled in the machine spec (`xid: [{code, at}]`) fires when the machine's
  clock reaches `at`. The sets are handed it lazily (when one is waited on), so each
  set remembers when it registered for XIDs on each GPU: an XID due at or before that
  moment fired before the set could hear it, and never reaches it. Nothing keeps a
  fired XID for a late listener (on a real node only the kernel log does).

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
    """One nvmlEventSet: the GPUs registered on it (spec index -> event type mask),
    since when each listens for XIDs (machine time), and the events waiting to be read."""

    handle: int
    registered: dict[int, int] = field(default_factory=dict)
    xids_since: dict[int, float] = field(default_factory=dict)
    queue: deque[Delivered] = field(default_factory=deque)
    delivered: set[tuple[int, int]] = field(default_factory=set)

    def register(self, gpu: int, mask: int, now: float) -> None:
        """Add event types `mask` on `gpu`, registered at machine time `now`."""
        self.registered[gpu] = self.registered.get(gpu, 0) | mask
        if mask & XID_CRITICAL_ERROR:
            self.xids_since.setdefault(gpu, now)

    def hears(self, xid: ScheduledXid) -> bool:
        """Whether this set was registered for XIDs on the XID's GPU before it fired."""
        since = self.xids_since.get(xid.gpu)
        return since is not None and since < xid.at

    def fire(self, gpu: int, code: int) -> None:
        """An XID firing now: queued when this set listens for XIDs on `gpu`."""
        if gpu in self.xids_since:
            self.queue.append(Delivered(gpu, XID_CRITICAL_ERROR, code))

    def collect_due(self, scheduled: Iterable[ScheduledXid], now: float) -> None:
        """Queue every scheduled XID that has fired while this set listened, once."""
        due = sorted(
            (x for x in scheduled if x.at <= now and x.key not in self.delivered
             and self.hears(x)),
            key=lambda x: x.at,
        )
        for xid in due:
            self.delivered.add(xid.key)
            self.queue.append(Delivered(xid.gpu, XID_CRITICAL_ERROR, xid.code))

    def next_due(self, scheduled: Iterable[ScheduledXid]) -> float | None:
        """When the earliest scheduled XID this set will hear falls due."""
        return min((x.at for x in scheduled if x.key not in self.delivered
                    and self.hears(x)), default=None)

    def next_event(self) -> Delivered | None:
        return self.queue.popleft() if self.queue else None
