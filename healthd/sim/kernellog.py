"""The simulated kernel log: a file in `/dev/kmsg`'s record format that the real
reader (checks.kernel_log.KernelLog) reads, as it reads the device on a node.

The machine spec's `kernel_log` messages are written when the machine starts, dated
just before it (they are its history since boot); `append` writes a line now, as the
driver would (an XID written while the agent is stopped, in tests). A log that already
holds records (a machine shared by several processes, healthd.sim.shared) is
continued, never rewritten. A replay of a
recording that holds no kernel log gets `NotRecordedLog`: every read says "not
recorded", so nothing is judged from it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from checks.kernel_log import NotRecorded
from checks.probes import Kind, Logged, LoggedXid
from checks.snapshot import GpuSnapshot, XidEvent

KERN_WARNING = 4  # printk level the NVIDIA drivers log XIDs and SXIDs at
NOT_RECORDED = "not recorded"


class SimKernelLog:
    """Appends records to `path` with increasing sequence numbers, dated by `uptime`
    (seconds since the simulated boot), after the records it already holds."""

    def __init__(self, path: Path, uptime: Callable[[], float]) -> None:
        self.path = path
        self._uptime = uptime
        path.touch()
        with path.open("rb") as log:
            self._seq = sum(1 for _ in log)  # one record per line, numbered from 0
        self._lock = threading.Lock()

    @property
    def empty(self) -> bool:
        """Whether nothing was logged yet."""
        return self._seq == 0

    def write_history(self, messages: Sequence[str]) -> None:
        """Lines logged before the machine started, one millisecond apart."""
        start = max(0.0, self._uptime() - len(messages) * 0.001)
        for n, message in enumerate(messages):
            self._write(message, start + n * 0.001)

    def append(self, message: str | bytes) -> None:
        """Log `message` now; bytes are written as they are, as a journal export or a
        syslog file keeps a line that is not UTF-8 (`/dev/kmsg` would escape them)."""
        self._write(message, self._uptime())

    def _write(self, message: str | bytes, at_s: float) -> None:
        raw = message.encode() if isinstance(message, str) else message
        with self._lock, self.path.open("ab") as log:
            log.write(f"{KERN_WARNING},{self._seq},{int(at_s * 1e6)},-;".encode() + raw + b"\n")
            self._seq += 1


class NotRecordedLog:
    """The kernel log of a recording that holds none (checks.kernel_log.KernelLogSource)."""

    def take(self, kind: Kind) -> list[Logged]:
        raise NotRecorded(NOT_RECORDED)

    def merge_xids(self, nvml: Sequence[XidEvent], logged: Sequence[LoggedXid],
                   gpus: Sequence[GpuSnapshot]) -> list[XidEvent]:
        return list(nvml)
