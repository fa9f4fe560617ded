"""Change a simulated machine from outside its process: a control file of JSON lines.

`healthd agent --sim SPEC --sim-control FILE` follows FILE: each complete line appended
to it is one change to the machine, applied at once, as a test or an operator at a
console would make it on a real node (an XID, a new fault, a repair):

    {"op": "emit_xid", "gpu": 3, "code": 79}
    {"op": "inject", "fault": {"gpu": 2, "remapped_rows": {"pending": true}}}
    {"op": "clear_faults"}                  # every GPU; or {"op": "clear_faults", "gpu": 2}
    {"op": "driver", "present": false}

A line that is not one of these is logged and skipped; the machine is unchanged.
Lines present when the agent starts are applied first, so a restarted agent finds the
machine as it was left.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from healthd.sim.fakenvml import FakeNvml
from healthd.sim.machine import GpuFault

log = logging.getLogger(__name__)
POLL_S = 0.2  # a test's change reaches the machine within this


def apply(fake: FakeNvml, line: str) -> None:
    """One control line; ValueError says what is wrong with it."""
    try:
        command: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(command, dict):
        raise ValueError("not a JSON object")
    op = command.get("op")
    try:
        if op == "emit_xid":
            fake.emit_xid(int(command["gpu"]), int(command["code"]))
        elif op == "inject":
            fake.inject(GpuFault.model_validate(command["fault"]))
        elif op == "clear_faults":
            gpu = command.get("gpu")
            fake.clear_faults(None if gpu is None else int(gpu))
        elif op == "driver":
            fake.set_driver_present(bool(command["present"]))
        else:
            raise ValueError(f"unknown op {op!r} (emit_xid, inject, clear_faults, driver)")
    except (KeyError, TypeError, ValidationError) as exc:
        raise ValueError(f"bad {op!r} command: {exc}") from None


class ControlFile:
    """Follows `path` in a daemon thread and applies its new lines to `fake`."""

    def __init__(self, path: Path, fake: FakeNvml) -> None:
        self.path, self.fake = path, fake
        self._offset = 0
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

    def poll(self) -> None:
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
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                apply(self.fake, line)
            except ValueError as exc:
                log.warning("sim control: skipped %r: %s", line[:200], exc)
