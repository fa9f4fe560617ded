"""The kernel log as a source of GPU and NVSwitch errors: XIDs and SXIDs from `/dev/kmsg`.

NVML delivers XIDs only while someone listens; the kernel log keeps them (and the
NVSwitch driver's SXIDs, which NVML never reports) with their time since boot, so an
agent that was down reads what happened meanwhile. Each `/dev/kmsg` read returns one
record, `prio,seq,usec,flags[,...];message` (continuation lines, which start with a
space, carry key=value pairs and are ignored). The lines healthd uses::

    NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress PRIV error

`KernelLog` reads new records from where it last stopped. Consumers (the `xid` and
`sxid` checks) each have a cursor, the last sequence number handed to them, kept in a
small JSON state file with the boot id: a restart neither loses nor repeats a record,
and a new boot (new boot id, sequence numbers start again) starts from the oldest
record still in the ring buffer. Without a state file, the cursors start at the
oldest record: everything since boot is news (what `healthd check` does).

Reading `/dev/kmsg` needs CAP_SYSLOG where `kernel.dmesg_restrict=1`; a read that
fails makes the source unavailable (`LogUnavailable`), never a crash. A regular file
in the same format stands in for `/dev/kmsg` in tests and the simulation.

XIDs the log and NVML both report are counted once (`merge_xids`): the same XID on
the same GPU within `dedup_window_s` of each other is one event.

A line the reader cannot use is skipped, never a finding and never a crash, but not
in silence: a `SkippedLines` tally counts the skipped lines by reason (each agent
has its own and exports it; `SKIPPED` is the process's default) and logs the first
of each reason. The reasons: one longer than the kernel ever hands out, a line that
is not a record, an XID or SXID line whose fields cannot be read (a driver that
prints them differently: its faults would go unseen), and a record with bytes that
are not UTF-8 in which no XID or SXID could be read (those bytes may hide one).

Bytes that are not UTF-8 do not cost a record its XID. `/dev/kmsg` escapes every
byte outside printable ASCII, but a journal export or a syslog file keeps the bytes
a user's process name holds (`name=...` in an XID line): such a record is decoded
with U+FFFD in place of what cannot be decoded and judged by its header and code,
as long as neither the address nor the code (nor an SXID's severity and link) holds
an undecodable byte; one that does is an XID or SXID whose fields cannot be read.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

import anyio

from checks.probes import Kind, Logged, LoggedSxid, LoggedXid
from checks.snapshot import GpuSnapshot, XidEvent

log = logging.getLogger(__name__)

KMSG = Path("/dev/kmsg")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
MAX_KEPT = 10_000  # parsed records kept for consumers that have not taken them yet
# The most /dev/kmsg hands out in one record, its continuation lines included (the
# kernel's CONSOLE_EXT_LOG_MAX): one read of this size takes any record whole.
MAX_RECORD = 8192

# The fields healthd judges by; none may end in an undecodable byte (U+FFFD), which
# could have been one more digit or letter of it.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)(?![\d\ufffd])")
_SXID = re.compile(
    r"(nvidia-nvswitch\d+): SXid \(PCI:([0-9a-fA-F:.]+)\): (\d+), ([^,\ufffd]*)(?=,|$)")
_LINK = re.compile(r"\bLink (\d+)(?![\w\ufffd])")
# What marks a line as the driver's XID or SXID report, parsed or not.
_XID_MARK = re.compile(r"NVRM: Xid\b")
_SXID_MARK = re.compile(r"\bSXid\b")

Skip = Literal["not_utf8", "oversize", "not_a_record", "bad_xid", "bad_sxid"]
SKIP_REASONS: tuple[Skip, ...] = get_args(Skip)
_WHY: dict[Skip, str] = {
    "not_utf8": "is not UTF-8 and reports no XID or SXID that could be read",
    "oversize": f"is longer than {MAX_RECORD} bytes",
    "not_a_record": "is not a record (prio,seq,usec,flags;message)",
    "bad_xid": "reports an XID whose fields cannot be read",
    "bad_sxid": "reports an SXID whose fields cannot be read",
}
_EXCERPT = 200  # characters of a skipped line its warning quotes


class SkippedLines:
    """Kernel-log lines that could not be used, counted by reason. The first of each
    reason is logged (a WARNING, once: a log full of garbage must not flood the
    agent's own log); the ones after it are only counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the readers run in worker threads
        self._counts: dict[Skip, int] = dict.fromkeys(SKIP_REASONS, 0)

    def skip(self, reason: Skip, line: str) -> None:
        with self._lock:
            self._counts[reason] += 1
            first = self._counts[reason] == 1
        if first:
            excerpt = line if len(line) <= _EXCERPT else line[:_EXCERPT] + "..."
            log.warning("kernel log: skipped a line that %s (later ones are only counted): "
                        "%r", _WHY[reason], excerpt)

    def counts(self) -> dict[Skip, int]:
        """Lines skipped so far, for every reason (0 for those never seen)."""
        with self._lock:
            return dict(self._counts)


# This process's skipped lines (an agent has one kernel log); its metrics read them.
SKIPPED = SkippedLines()


class LogUnavailable(Exception):
    """The kernel log cannot be read now; the message says why."""


class NotRecorded(LogUnavailable):
    """A replayed recording holds no kernel log: nothing can be said (SKIPPED)."""


class NoLog(LogUnavailable):
    """There is no kernel log at the path (a pod without /dev/kmsg mounted): SKIPPED."""


@dataclass(frozen=True)
class LogRecord:
    """One kernel-log record: sequence number, time since boot, the message.
    `garbled`: the record held bytes that are not UTF-8, U+FFFD in the message."""

    seq: int
    usec: int
    message: str
    garbled: bool = False


def parse_record(raw: str) -> LogRecord | None:
    """A `/dev/kmsg` record (`prio,seq,usec,flags;message`), or None for anything else
    (a continuation line, garbage)."""
    header, sep, message = raw.partition(";")
    if not sep or raw.startswith(" "):
        return None
    fields = header.split(",")
    if len(fields) < 3:
        return None
    try:
        seq, usec = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return LogRecord(seq, usec, message.split("\n", 1)[0].rstrip())


def read_record(raw: bytes, skipped: SkippedLines) -> LogRecord | None:
    """The record in one raw `/dev/kmsg` read or file line, what is not UTF-8 in it
    replaced (`garbled`); None for a continuation or blank line (nothing in it to
    lose) and for garbage, which `skipped` counts."""
    if len(raw) > MAX_RECORD:
        skipped.skip("oversize", raw[:_EXCERPT + 1].decode(errors="backslashreplace"))
        return None
    try:
        text, garbled = raw.decode(), False
    except UnicodeDecodeError:
        text, garbled = raw.decode(errors="replace"), True
    if not text.strip() or text.startswith(" "):
        return None
    record = parse_record(text)
    if record is None:
        skipped.skip("not_a_record", text)
        return None
    return replace(record, garbled=garbled)


def unusable(record: LogRecord) -> Skip | None:
    """Why a record that `parse_nvidia` did not take is counted as skipped, or None: it
    is some other line, read whole."""
    if _XID_MARK.search(record.message):
        return "bad_xid"
    if _SXID_MARK.search(record.message):
        return "bad_sxid"
    return "not_utf8" if record.garbled else None


def parse_nvidia(record: LogRecord) -> Logged | None:
    """The XID or SXID a record reports, or None for every other line."""
    if m := _XID.search(record.message):
        return LoggedXid(int(m.group(2)), pci_key(m.group(1)), record.seq, record.usec,
                         record.message)
    if m := _SXID.search(record.message):
        link = _LINK.search(record.message)
        return LoggedSxid(int(m.group(3)), m.group(1).removeprefix("nvidia-"),
                          pci_key(m.group(2)), m.group(4).strip().lower() == "fatal",
                          int(link.group(1)) if link else None, record.seq, record.usec,
                          record.message)
    return None


def pci_key(address: str) -> str:
    """`domain:bus:device` in lower case with a 4-digit domain, from the driver's
    `0000:18:00`, an NVSwitch's `0000:05:00.0` or NVML's `00000000:18:00.0`: the
    same device gives the same key whatever printed it."""
    parts = address.strip().lower().split(".")[0].split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return address.strip().lower()
    domain, bus, device = parts
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"
    except ValueError:
        return address.strip().lower()


class KernelLog:
    """The real source: `/dev/kmsg` (or a file in its format), read incrementally,
    with cursors kept in `state_file` (None: not kept). `uptime` gives seconds since
    boot on the kernel's log clock, to date records (None: CLOCK_MONOTONIC);
    `dedup_window_s` bounds how far apart an NVML event and a log line for the same
    XID may be to count once; `skipped` counts the lines it cannot use (None: this
    process's `SKIPPED`)."""

    def __init__(self, path: Path = KMSG, *, state_file: Path | None = None,
                 boot_id_file: Path = BOOT_ID,
                 uptime: Callable[[], float] | None = None,
                 dedup_window_s: float = 10.0,
                 skipped: SkippedLines | None = None) -> None:
        self.path = path
        self._skipped = skipped or SKIPPED
        self.state_file = state_file
        self.dedup_window_s = dedup_window_s
        self._uptime = uptime or _log_clock
        self._boot_id = _read_text(boot_id_file)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._partial = b""  # a regular file's last, unfinished line
        self._kept: deque[Logged] = deque(maxlen=MAX_KEPT)
        self._last_seq = -1
        self._cursors: dict[str, int] = self._load_cursors()
        self._seen: deque[tuple[str, int, float, str]] = deque(maxlen=1000)
        self._save_problem = ""

    # -- reading ---------------------------------------------------------------------

    def take(self, kind: Kind) -> list[Logged]:
        with self._lock:
            self._read_new()
            cursor = self._cursors.get(kind, -1)
            wanted = LoggedXid if kind == "xid" else LoggedSxid
            new = [r for r in self._kept if isinstance(r, wanted) and r.seq > cursor]
            self._cursors[kind] = max(cursor, self._last_seq)
            self._save_cursors()
            return new

    def pending(self, kind: Kind) -> bool:
        """Whether records of `kind` wait for their consumer (read, not handed out)."""
        with self._lock:
            self._read_new()
            cursor = self._cursors.get(kind, -1)
            wanted = LoggedXid if kind == "xid" else LoggedSxid
            return any(isinstance(r, wanted) and r.seq > cursor for r in self._kept)

    async def wait(self, poll_s: float) -> None:
        """Until the log may hold new records: `/dev/kmsg` wakes its readers (poll),
        a regular file (tests, the simulation) is looked at every `poll_s`."""
        if self.path.is_char_device():
            with self._lock:
                fd = self._open()
            await anyio.wait_readable(fd)
        else:
            await anyio.sleep(poll_s)

    def _read_new(self) -> None:
        """Parse every record written since the last read; keep the NVIDIA ones."""
        for raw in self._raw_records():
            record = read_record(raw, self._skipped)
            if record is None or record.seq <= self._last_seq:
                continue
            self._last_seq = record.seq
            logged = parse_nvidia(record)
            if logged is not None:
                self._kept.append(logged)
            elif (reason := unusable(record)) is not None:
                self._skipped.skip(reason, record.message)

    def _raw_records(self) -> Iterable[bytes]:
        fd = self._open()
        if not self.path.is_char_device():
            try:
                data, self._partial = _read_lines(fd, self._partial)
            except OSError as exc:
                raise LogUnavailable(f"cannot read {self.path}: {exc.strerror}") from exc
            yield from data
            return
        while True:  # /dev/kmsg: one record per read, EAGAIN at the end
            try:
                chunk = os.read(fd, MAX_RECORD)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                raise LogUnavailable(f"cannot read {self.path}: {exc.strerror}") from exc
            if not chunk:
                return
            yield chunk

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise NoLog(f"no kernel log at {self.path}") from exc
            except OSError as exc:
                raise LogUnavailable(f"cannot read {self.path}: {exc.strerror}") from exc
        return self._fd

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- cursors ---------------------------------------------------------------------

    def _load_cursors(self) -> dict[str, int]:
        """The cursors of this boot; none after a reboot or without a readable file."""
        if self.state_file is None:
            return {}
        try:
            state = json.loads(self.state_file.read_text())
            if state.get("boot_id") != self._boot_id:
                return {}
            return {k: int(v) for k, v in dict(state["cursors"]).items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}  # missing or damaged: read everything since boot again

    def _save_cursors(self) -> None:
        """Keep the cursors; a position that cannot be kept is logged (once per
        problem), never a reason to drop what was read: a restart would read those
        lines again, which repeats a finding but loses none."""
        if self.state_file is None:
            return
        state = {"boot_id": self._boot_id, "cursors": self._cursors}
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.state_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(state))
            temporary.replace(self.state_file)  # atomic: a crash leaves the old one
        except OSError as exc:
            problem = f"cannot keep the kernel-log position in {self.state_file}: {exc.strerror}"
            if problem != self._save_problem:
                log.warning("%s", problem)
            self._save_problem = problem
        else:
            self._save_problem = ""

    # -- NVML and the log together ---------------------------------------------------

    def merge_xids(self, nvml: Sequence[XidEvent], logged: Sequence[LoggedXid],
                   gpus: Sequence[GpuSnapshot]) -> list[XidEvent]:
        by_pci = {pci_key(g.pci_bus_id): g for g in gpus if g.pci_bus_id}
        by_uuid = {g.uuid: g for g in gpus if g.uuid}
        merged: list[XidEvent] = []
        with self._lock:
            for event in nvml:
                gpu = by_uuid.get(event.uuid)
                key = pci_key(gpu.pci_bus_id) if gpu is not None else f"#{event.gpu_index}"
                if not self._duplicate(key, event.xid, event.at, "nvml"):
                    merged.append(event)
            for line in logged:
                event = self._as_event(line, by_pci.get(line.pci))
                if not self._duplicate(line.pci, line.xid, event.at, "log"):
                    merged.append(event)
        return merged

    def _duplicate(self, key: str, xid: int, at: float, source: str) -> bool:
        """Whether the other source reported this XID on this GPU close to `at`;
        remembers it otherwise."""
        for seen_key, seen_xid, seen_at, seen_source in self._seen:
            if (seen_key, seen_xid, seen_source != source) == (key, xid, True) \
                    and abs(seen_at - at) <= self.dedup_window_s:
                return True
        self._seen.append((key, xid, at, source))
        return False

    def _as_event(self, line: LoggedXid, gpu: GpuSnapshot | None) -> XidEvent:
        at = time.time() - max(0.0, self._uptime() - line.usec / 1e6)
        if gpu is None:  # a GPU NVML does not list (any more): named by its address
            return XidEvent(xid=line.xid, gpu_index=-1, uuid="", at=at, pci_bus_id=line.pci)
        return replace(XidEvent(line.xid, gpu.index, gpu.uuid, at), pci_bus_id=gpu.pci_bus_id)


def _read_lines(fd: int, partial: bytes) -> tuple[list[bytes], bytes]:
    """Whole lines appended to a regular file since the last read, and the unfinished
    last one: cut just past MAX_RECORD, which keeps it oversize (skipped once it ends)
    without keeping a line that never ends."""
    chunks = [partial]
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    data = b"".join(chunks)
    complete, newline, rest = data.rpartition(b"\n")
    if not newline:
        return [], data[:MAX_RECORD + 1]
    return complete.split(b"\n"), rest[:MAX_RECORD + 1]


def _log_clock() -> float:
    """Seconds since boot on the clock the kernel dates its log with (printk's
    local_clock follows CLOCK_MONOTONIC)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
