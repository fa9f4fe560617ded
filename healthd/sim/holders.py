"""Who holds the GPUs of a simulated machine: what a real driver counts before it lets
`nvidia-smi --gpu-reset` go ahead (healthd.sim.nvidia_smi refuses while any holds).

- **NVML sessions.** A process has every GPU's device files open from its first
  `nvmlInit` to its last `nvmlShutdown`. The fake NVML library registers it in the
  machine's directory (`holders/nvml-<pid>`, healthd.sim.shared), so every process on
  the machine sees it. A process that died holds nothing, as the kernel closes a dead
  process's files: its pid is gone, a zombie, or another process now (the file keeps
  the process's start time). A process without a shared machine registers nothing.
- **Compute processes**: a `busy` fault's, while it is active.
- **Persistence mode**, while on: the fake NVML library's live state (`gpus.
  persistence_mode` at boot, changed by `nvmlDeviceSetPersistenceMode`, `nvidia-smi
  -pm` or a control line).
- **Named holders**: host daemons outside Kubernetes the spec names (`holders`), and
  those a control line adds until one releases them, a test's or a stand-in pod's::

      {"op": "hold", "name": "nv-hostengine", "gpus": [0, 1]}     # or "all"
      {"op": "release", "name": "nv-hostengine"}

  `hold(control, name, gpus)` and `release(control, name)` write them from any
  process (a simulated kubelet: "pod X holds GPUs of machine M while it runs"),
  `held(...)` both around a block. Each has a pid of its own (`named_pid`), as a
  real daemon would, and keeps holding across a reboot (it starts again with the
  node).

`SimDeviceUsers` is the /proc view of these holders that `healthd gpu-reset` reads on
a simulated machine (healthd.repair.holders.DeviceUsers): a session's process and a
named holder have `/dev/nvidiactl` and each held GPU's `/dev/nvidia<minor>` open; a
busy fault's processes have their GPU's.
"""

from __future__ import annotations

import json
import os
import re
import threading
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from healthd.repair.holders import DeviceUser
from healthd.sim.gpustate import GpuState
from healthd.sim.machine import MachineSpec
from healthd.sim.nvmlsymbols import busy_pids
from healthd.sim.shared import machine_root

HOLDERS = "holders"
# A named holder's pid: above Linux's largest (4194304), so it is never a real process's,
# plus a hash of its name in a range wide enough that a few names do not share one.
NAMED_PID_BASE = 5_000_000
NAMED_PIDS = 1_000_000
_DEVICE = re.compile(r"nvidia(\d+)")


@dataclass(frozen=True)
class Process:
    pid: int
    name: str  # its command name (comm)


def _start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22);
    None when there is no such process or it has exited (a zombie has no files)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def _own_name() -> str:
    try:
        return Path("/proc/self/comm").read_text().strip()
    except OSError:
        return "python"


@dataclass(frozen=True)
class Sessions:
    """One process's NVML: sessions open, nvmlInit calls ever, event sets not freed."""

    open: int = 0
    inits: int = 0
    event_sets: int = 0

    @property
    def holding(self) -> bool:
        """Whether the process holds the GPUs (a session or an event set)."""
        return self.open > 0 or self.event_sets > 0


class NvmlSessions:
    """What each process holds of NVML on the machine whose directory is `root`: one
    file per process that ever opened NVML there (`holders/nvml-<pid>`), written by its
    fake library at each change, so that every other process (the simulated
    nvidia-smi, a test) can tell."""

    def __init__(self, root: Path) -> None:
        self.folder = root / HOLDERS

    def record(self, sessions: Sessions) -> None:
        """What this process holds now (its file stays once it let go: `inits` counts
        on)."""
        pid = os.getpid()
        self.folder.mkdir(parents=True, exist_ok=True)
        body = {"pid": pid, "start": _start_time(pid), "name": _own_name(), **asdict(sessions)}
        path = self.folder / f"nvml-{pid}"
        draft = path.with_suffix(".tmp")
        draft.write_text(json.dumps(body))
        draft.replace(path)  # atomic: a reader never sees half a file

    def every(self) -> dict[int, tuple[Process, Sessions]]:
        """Per process that ever opened NVML here, what it holds now: a process that is
        gone (its pid gone, a zombie, or another process now) holds nothing, its inits
        kept."""
        found: dict[int, tuple[Process, Sessions]] = {}
        for path in sorted(self.folder.glob("nvml-*")):
            if path.suffix == ".tmp":
                continue
            try:
                body = json.loads(path.read_text())
                pid, start, name = int(body["pid"]), body["start"], str(body["name"])
                sessions = Sessions(int(body["open"]), int(body["inits"]),
                                    int(body["event_sets"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # written meanwhile, or not ours: holds nothing
            if start is None or _start_time(pid) != start:
                sessions = Sessions(inits=sessions.inits)
            found[pid] = (Process(pid, name), sessions)
        return found

    def live(self) -> list[Process]:
        """The processes that hold NVML now, by pid."""
        return [p for p, sessions in self.every().values() if sessions.holding]


def nvml_sessions(control: Path) -> dict[int, Sessions]:
    """Per process (pid) that ever opened NVML on the machine `control` names, what it
    holds now (a process that is gone: nothing, its inits kept)."""
    return {pid: s for pid, (_, s) in NvmlSessions(machine_root(control)).every().items()}


def named_pid(name: str) -> int:
    """The pid a named holder has on the machine."""
    return NAMED_PID_BASE + zlib.crc32(name.encode()) % NAMED_PIDS


class MachineHolders:
    """What holds the machine's GPUs, as one process on it sees them: the NVML
    sessions (None: a machine of this process alone, where none registers) and the
    named holders, the spec's on the machine's clock and those added at run time."""

    def __init__(self, spec: MachineSpec, clock: Callable[[], float],
                 sessions: NvmlSessions | None = None) -> None:
        self.spec, self.clock, self.sessions = spec, clock, sessions
        self._named: dict[str, frozenset[int]] = {}  # added at run time
        self._lock = threading.Lock()

    def hold(self, name: str, gpus: Sequence[int] | None) -> None:
        """`name` holds `gpus` (None: every GPU) from now on (ValueError: no such GPU)."""
        count = self.spec.gpus.count
        chosen = range(count) if gpus is None else gpus
        if not name or any(not 0 <= gpu < count for gpu in chosen):
            raise ValueError(f"hold needs a name and GPUs of the machine (0..{count - 1})")
        with self._lock:
            self._named[name] = frozenset(chosen)

    def release(self, name: str) -> None:
        """`name` holds nothing any more (ValueError when it held nothing)."""
        with self._lock:
            if self._named.pop(name, None) is None:
                raise ValueError(f"no holder named {name!r}")

    def named(self, gpu: int) -> list[str]:
        """The named holders of `gpu` now."""
        now = self.clock()
        found = [h.name for h in self.spec.holders if h.at <= now
                 and (h.until is None or now < h.until) and (h.gpus == "all" or gpu in h.gpus)]
        with self._lock:
            found += [name for name, gpus in self._named.items() if gpu in gpus]
        return sorted(set(found))

    def nvml_sessions(self, exclude: int | None = None) -> list[Process]:
        """The processes with an NVML session open now, but `exclude`."""
        live = self.sessions.live() if self.sessions is not None else []
        return [p for p in live if p.pid != exclude]


class SimDeviceUsers:
    """The machine's holders as /proc shows them (see the module docstring)."""

    def __init__(self, holders: MachineHolders, state: Callable[[int], GpuState]) -> None:
        self.holders, self.state = holders, state

    def users(self, paths: Collection[str]) -> list[DeviceUser]:
        found: list[DeviceUser] = []
        for path in paths:
            gpus = self._gpus_of(path)
            processes = {p.pid: p.name for p in self.holders.nvml_sessions()} if gpus else {}
            for gpu in gpus:
                processes |= {named_pid(n): n for n in self.holders.named(gpu)}
                processes |= {pid: "" for pid in busy_pids(self.state(gpu))}
            found += [DeviceUser(pid, name, path) for pid, name in sorted(processes.items())]
        return found

    def name(self, pid: int) -> str:
        every = self.holders.spec.gpus.count
        users = self.users([f"nvidia{gpu}" for gpu in range(every)])
        return next((u.name for u in users if u.pid == pid), "")

    def _gpus_of(self, path: str) -> list[int]:
        """The GPUs whose holders have `path` open: the control device, every GPU."""
        base = Path(path).name
        count = self.holders.spec.gpus.count
        if base == "nvidiactl":
            return list(range(count))
        match = _DEVICE.fullmatch(base)
        return [int(match[1])] if match and int(match[1]) < count else []


def hold(control: Path, name: str, gpus: Sequence[int] | None = None) -> None:
    """From now on `name` holds `gpus` (None: every GPU) of the machine `control` names
    (a pod that started with them, a daemon): a control line, from any process."""
    _append(control, {"op": "hold", "name": name, "gpus": "all" if gpus is None else list(gpus)})


def release(control: Path, name: str) -> None:
    """`name` holds nothing of the machine `control` names any more."""
    _append(control, {"op": "release", "name": name})


@contextmanager
def held(control: Path, name: str, gpus: Sequence[int] | None = None) -> Iterator[None]:
    """`name` holds `gpus` (None: every GPU) of the machine `control` names while the
    block runs."""
    hold(control, name, gpus)
    try:
        yield
    finally:
        release(control, name)


def _append(control: Path, command: dict[str, object]) -> None:
    with control.open("a") as handle:
        handle.write(json.dumps(command) + "\n")
