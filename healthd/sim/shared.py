"""One simulated machine across processes: the machine a control file names.

A real node outlives the agent process: when the agent is replaced, the node's clock,
its uptime and its kernel log go on, and an NVML event that fired while the old
process listened is gone for the new one. So does a simulated machine that
`--sim-control FILE` names: every process started with FILE (and the same spec) runs
on one machine, whose state lives in the directory beside FILE (`FILE.machine/`):

- `started`: when the machine started (Unix time), written by its first process.
  Each process's machine clock counts from it, so the spec's times (a fault's `at`
  and `until`, an XID's `at`) and the uptime are the machine's, not the process's:
  an XID that fired before a process registered for it never reaches that process;
- the machine's files (healthd.sim.node): the kernel log, the agent's position in it
  and the RDMA sysfs tree;

Another spec on the same FILE is another machine (a node re-imaged): its directory
starts afresh. Without a control file each process is a machine of its own, started
with the process.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from healthd.sim.machine import MachineSpec

SUFFIX = ".machine"
SPEC = "spec.json"


@dataclass(frozen=True)
class SharedMachine:
    """The directory of the machine a control file names, and when it started."""

    root: Path
    started_at: float  # Unix time

    def elapsed(self) -> float:
        """Seconds since the machine started."""
        return max(0.0, time.time() - self.started_at)


def machine_root(control: Path) -> Path:
    """The directory of the machine `control` names."""
    return control.with_name(control.name + SUFFIX)


def spec_file(control: Path) -> Path:
    """The spec of the machine `control` names, as its first process wrote it: what
    another process passes as `--sim` to run on that machine, not a new one."""
    return machine_root(control) / SPEC


def shared_machine(control: Path, spec: MachineSpec) -> SharedMachine:
    """The machine `control` names, running `spec`: created by the first process that
    asks, found by the next (ValueError when its start time is unreadable)."""
    root = machine_root(control)
    _hold(root, spec)
    started = root / "started"
    text = _create_once(started, f"{time.time()!r}\n")
    try:
        return SharedMachine(root, float(text))
    except ValueError:
        raise ValueError(f"{started}: not a machine start time: {text[:40]!r} "
                         f"(remove {root} to start the machine afresh)") from None


def _hold(root: Path, spec: MachineSpec) -> None:
    """Make `root` the directory of `spec`'s machine: another spec's is cleared."""
    marker, text = root / SPEC, spec.model_dump_json()
    if root.is_dir() and _read(marker) != text:
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    _create_once(marker, text)


def _create_once(path: Path, text: str) -> str:
    """Write `path` unless it exists (atomically: of processes starting together, the
    first one's text wins); return what it holds."""
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    draft.write_text(text)
    try:
        os.link(draft, path)
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return path.read_text()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
