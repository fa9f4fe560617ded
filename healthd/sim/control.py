"""Change a simulated machine from outside its process: a control file of JSON lines.

`healthd agent --sim SPEC --sim-control FILE` follows FILE: each complete line appended
to it is one change to the machine, applied at once, as a test or an operator at a
console would make it on a real node (an XID, a new fault, a repair, a cable pulled):

    {"op": "emit_xid", "gpu": 3, "code": 79}
    {"op": "inject", "fault": {"gpu": 2, "remapped_rows": {"pending": true}}}
    {"op": "clear_faults"}                  # every GPU; or {"op": "clear_faults", "gpu": 2}
    {"op": "driver", "present": false}
    {"op": "gpu_reset", "gpu": 2}           # what a reset did (healthd.sim.repairs)
    {"op": "reboot"}                        # the GPUs keep only what survives a reboot
    {"op": "persistence", "gpu": 2, "enabled": false}   # every GPU without "gpu"
    {"op": "hold", "name": "nv-hostengine", "gpus": [0, 1]}   # or "all" (healthd.sim.holders)
    {"op": "release", "name": "nv-hostengine"}
    {"op": "rdma_port", "device": "mlx5_0", "state": "DOWN", "phys_state": "Disabled"}
    {"op": "rdma_port", "device": "mlx5_0", "counters": {"symbol_error": 12}}

A line that is not one of these is logged and skipped; the machine is unchanged.
A process that holds the machine itself (the demo's fleet) makes its own changes
with `ControlFile.change`: applied at once (a bad one raises, and is not written),
then written to FILE for the machine's other processes, and not applied twice.
Lines present when the agent starts are applied first, so a restarted agent finds the
machine as it was left (FILE names one machine across processes, healthd.sim.shared):
an XID emitted then fired while nobody listened, and reaches no one now.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from healthd.sim.fakenvml import FakeNvml
from healthd.sim.holders import MachineHolders
from healthd.sim.machine import GpuFault
from healthd.sim.rdma import SimRdma

log = logging.getLogger(__name__)
POLL_S = 0.2  # a test's change reaches the machine within this
APPLIED_S = 3 * POLL_S  # by then every process following the file has applied a change


class Machine(Protocol):
    """What the control file changes (healthd.sim.node.SimulatedNode)."""

    @property
    def nvml(self) -> FakeNvml: ...

    @property
    def rdma(self) -> SimRdma | None: ...

    @property
    def holders(self) -> MachineHolders: ...


Command = dict[str, Any]


def _emit_xid(machine: Machine, command: Command) -> None:
    machine.nvml.emit_xid(int(command["gpu"]), int(command["code"]))


def _inject(machine: Machine, command: Command) -> None:
    machine.nvml.inject(GpuFault.model_validate(command["fault"]))


def _clear_faults(machine: Machine, command: Command) -> None:
    gpu = command.get("gpu")
    machine.nvml.clear_faults(None if gpu is None else int(gpu))


def _driver(machine: Machine, command: Command) -> None:
    machine.nvml.set_driver_present(bool(command["present"]))


def _gpu_reset(machine: Machine, command: Command) -> None:
    gpu = int(command["gpu"])
    if not machine.nvml.reset_gpu(gpu):
        raise ValueError(f"the reset cannot reach gpu {gpu} (lost from the bus or missing)")


def _reboot(machine: Machine, command: Command) -> None:
    machine.nvml.reboot()


def _persistence(machine: Machine, command: Command) -> None:
    gpu = command.get("gpu")
    enabled = command["enabled"]
    if not isinstance(enabled, bool):
        raise ValueError("enabled must be true or false")
    machine.nvml.set_persistence(None if gpu is None else int(gpu), enabled)


def _hold(machine: Machine, command: Command) -> None:
    gpus = command.get("gpus", "all")
    if gpus != "all" and not isinstance(gpus, list):
        raise ValueError('gpus must be a list of GPU positions or "all"')
    machine.holders.hold(str(command["name"]), None if gpus == "all" else [int(g) for g in gpus])


def _release(machine: Machine, command: Command) -> None:
    machine.holders.release(str(command["name"]))


def _rdma_port(machine: Machine, command: Command) -> None:
    if machine.rdma is None:
        raise ValueError("this machine has no RDMA ports (a recording that holds none)")
    changes = {k: v for k, v in command.items() if k not in ("op", "device", "port")}
    machine.rdma.set_port(str(command["device"]), int(command.get("port", 1)), **changes)


OPS: dict[str, Callable[[Machine, Command], None]] = {
    "emit_xid": _emit_xid, "inject": _inject, "clear_faults": _clear_faults,
    "driver": _driver, "rdma_port": _rdma_port, "gpu_reset": _gpu_reset, "reboot": _reboot,
    "persistence": _persistence, "hold": _hold, "release": _release,
}


def apply(machine: Machine, line: str) -> None:
    """One control line; ValueError says what is wrong with it."""
    try:
        command: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(command, dict):
        raise ValueError("not a JSON object")
    op = command.get("op")
    change = OPS.get(op) if isinstance(op, str) else None
    if change is None:
        raise ValueError(f"unknown op {op!r} ({', '.join(OPS)})")
    try:
        change(machine, command)
    except (KeyError, TypeError, ValidationError) as exc:
        raise ValueError(f"bad {op!r} command: {exc}") from None


class ControlFile:
    """Follows `path` in a daemon thread and applies its new lines to `machine`."""

    def __init__(self, path: Path, machine: Machine) -> None:
        self.path, self.machine = path, machine
        self._offset = 0
        self._own: list[bytes] = []  # lines this process wrote (already applied here)
        self._lock = threading.Lock()  # one reader of the file at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sim-control", daemon=True)

    def __enter__(self) -> ControlFile:
        self.poll()  # what the file already says holds before the agent's first round
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * POLL_S)

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def change(self, command: Command) -> None:
        """Apply `command` to the machine now, then write it to the file for the
        machine's other processes; ValueError (nothing written) for a bad one."""
        line = json.dumps(command, separators=(",", ":"))
        with self._lock:
            self._poll()  # what other processes changed first, in the file's order
            apply(self.machine, line)
            with open(self.path, "ab") as handle:
                handle.write(line.encode() + b"\n")
            self._own.append(line.encode())

    def poll(self) -> None:
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        complete, _, _ = data.rpartition(b"\n")
        if not complete:
            return
        self._offset += len(complete) + 1
        for raw in complete.split(b"\n"):
            if self._own and raw == self._own[0]:  # ours: applied when it was written
                self._own.pop(0)
                continue
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                apply(self.machine, line)
            except ValueError as exc:
                log.warning("sim control: skipped %r: %s", line[:200], exc)
