"""What still holds a GPU: the report `healthd gpu-reset` makes before it lets go, and
the /proc view it is partly built from.

NVIDIA's rule: `nvidia-smi --gpu-reset` resets a GPU only when nothing holds it, and
refuses ("In use by another client") otherwise. Per GPU the report names:

- the compute and graphics processes NVML lists on it (checks.nvml_reset);
- the processes with its device file (`/dev/nvidiaN`, N its minor number) or the
  driver's control device (`/dev/nvidiactl`) open, found as fuser finds them, by
  reading the links in `/proc/*/fd`: every NVML client (a monitoring agent, DCGM,
  dcgm-exporter, the device plugin) shows there, since NVML opens them at init and
  keeps them until shut down. Only the processes this one can see: in a container,
  those of its PID namespace;
- persistence mode, when on: the driver counts it as a client.

The command's own process is left out: it has NVML open while it looks.

The /proc view is a small protocol, `DeviceUsers`: `ProcDeviceUsers` reads the real
one (its root injectable); the simulation serves its machine's holder registry in its
place (healthd.sim.holders), the innermost edge and nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from checks.nvml_reset import GpuView

PERSISTENCE_MODE = "persistence mode"
LET_GO = "persistence mode (turned off for the reset)"
DEV = Path("/dev")
PROC = Path("/proc")


@dataclass(frozen=True)
class DeviceUser:
    """A process with a device file open."""

    pid: int
    name: str  # its command name (/proc/PID/comm); "" when unknown
    path: str  # the device file


class DeviceUsers(Protocol):
    """Who has device files open on the node, as /proc shows it."""

    def users(self, paths: Collection[str]) -> list[DeviceUser]:
        """Every process with one of `paths` open: one entry per process and path."""
        ...

    def name(self, pid: int) -> str:
        """The command name of process `pid`; "" when it cannot be seen."""
        ...


class ProcDeviceUsers:
    """`DeviceUsers` read from the real /proc (or a tree at `proc`). A process whose
    fds cannot be read (another user's, without the rights) is not seen."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc

    def users(self, paths: Collection[str]) -> list[DeviceUser]:
        wanted = set(paths)
        found: list[DeviceUser] = []
        for entry in self._processes():
            opened = sorted(wanted & self._open_files(entry))
            found += [DeviceUser(int(entry.name), self.name(int(entry.name)), path)
                      for path in opened]
        return found

    def name(self, pid: int) -> str:
        try:
            return (self.proc / str(pid) / "comm").read_text().strip()
        except OSError:
            return ""

    def _processes(self) -> list[Path]:
        try:
            return [p for p in self.proc.iterdir() if p.name.isdigit()]
        except OSError:
            return []

    @staticmethod
    def _open_files(process: Path) -> set[str]:
        """What the process's fds point at (nothing when they cannot be read; a fd
        closed meanwhile is skipped)."""
        try:
            fds = list((process / "fd").iterdir())
        except OSError:
            return set()
        targets: set[str] = set()
        for fd in fds:
            try:
                targets.add(os.readlink(fd))
            except OSError:
                continue
        return targets


def device_paths(minor: int, dev: Path = DEV) -> list[str]:
    """The device files a client of GPU `minor` has open."""
    return [str(dev / f"nvidia{minor}"), str(dev / "nvidiactl")]


def holders(view: GpuView, users: DeviceUsers, *, own_pid: int, dev: Path = DEV) -> list[str]:
    """What holds the GPU `view` describes, one line per process (pid order), then
    persistence mode; the process `own_pid` left out."""
    hows: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for pid, kind in view.processes:
        hows.setdefault(pid, []).append(f"{kind} process")
    if view.minor is not None:
        for user in users.users(device_paths(view.minor, dev)):
            hows.setdefault(user.pid, []).append(f"{user.path} open")
            names[user.pid] = user.name
    hows.pop(own_pid, None)
    lines = [f"{_process(pid, names.get(pid) or users.name(pid))}: {', '.join(how)}"
             for pid, how in sorted(hows.items())]
    return [*lines, PERSISTENCE_MODE] if view.persistence else lines


def _process(pid: int, name: str) -> str:
    return f"pid {pid} ({name})" if name else f"pid {pid}"


def named(lines: Sequence[str], limit: int) -> list[str]:
    """At most `limit` of `lines`, the rest counted ("+3 more")."""
    if len(lines) <= limit:
        return list(lines)
    return [*lines[:limit], f"+{len(lines) - limit} more"]
