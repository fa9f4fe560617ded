"""What each process holds of NVML on a shared simulated machine, seen from outside it.

A GPU reset is refused while any process holds an NVML session on the GPU, and the
driver ends a process's session when the process ends. So that a test can tell
whether a process (an agent) holds the GPUs, or ever opened NVML, without asking it,
the fake NVML library (healthd.sim.fakenvml) of every process started with
`--sim-control FILE` writes what it holds at each change, one file per process in the
machine's directory (healthd.sim.shared), `FILE.machine/nvml-sessions/<pid>.json`:

    {"open": 1, "inits": 3, "event_sets": 1}

`open`: nvmlInit calls not matched by nvmlShutdown; `inits`: nvmlInit calls ever;
`event_sets`: event sets not freed. `nvml_sessions(FILE)` reads them back; a process
that is gone holds nothing, whatever its file says.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from healthd.sim.shared import machine_root

DIRECTORY = "nvml-sessions"


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


def recorder(root: Path, pid: int) -> Callable[[Sessions], None]:
    """What writes process `pid`'s sessions into the machine directory `root`."""
    directory = root / DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{pid}.json"

    def record(sessions: Sessions) -> None:
        draft = path.with_suffix(".tmp")
        draft.write_text(json.dumps(asdict(sessions)))
        draft.replace(path)  # atomic: a reader never sees half a file
    return record


def nvml_sessions(control: Path) -> dict[int, Sessions]:
    """Per process (pid) that ever opened NVML on the machine `control` names, what it
    holds now (a process that is gone: nothing, its inits kept)."""
    found: dict[int, Sessions] = {}
    for path in sorted((machine_root(control) / DIRECTORY).glob("*.json")):
        pid = int(path.stem)
        sessions = Sessions(**json.loads(path.read_text()))
        found[pid] = sessions if _alive(pid) else Sessions(inits=sessions.inits)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
