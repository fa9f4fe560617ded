"""Helpers for tests of who holds a simulated machine's GPUs: a machine shared through a
control file, a real child process that keeps an NVML session open on it, the
simulated nvidia-smi, and what the control file says was done."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from healthd.sim import nvidia_smi
from healthd.sim.machine import MachineSpec, load_machine_spec
from healthd.sim.shared import shared_machine

# A process on the machine with an NVML session: it says so, then waits for its stdin.
_HOLD = """
import sys, pynvml
from healthd.sim.node import simulate
with simulate(sys.argv[1], sys.argv[2]):
    pynvml.nvmlInit()
    print("holding", flush=True)
    sys.stdin.readline()
    pynvml.nvmlShutdown()
"""


@dataclass(frozen=True)
class Machine:
    spec: MachineSpec
    spec_file: Path
    control: Path

    def uuid(self, gpu: int) -> str:
        return self.spec.uuid(gpu)

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The simulated nvidia-smi on this machine."""
        return subprocess.run([*nvidia_smi.command(self.control), *args], capture_output=True,
                              text=True, timeout=60, check=False)

    def lines(self, op: str) -> list[dict[str, Any]]:
        """The control file's commands `op`, in order."""
        commands = [json.loads(line) for line in self.control.read_text().splitlines() if line]
        return [c for c in commands if c.get("op") == op]


def spec_with(base: str = "healthy-8xh100", **fields: Any) -> MachineSpec:
    """`base` with `fields` changed (`gpus` fields merged into the base's)."""
    raw = load_machine_spec(base).model_dump()
    raw["gpus"] = {**raw["gpus"], **fields.pop("gpus", {})}
    return MachineSpec.model_validate({**raw, **fields})


def machine(tmp_path: Path, base: str = "healthy-8xh100", **fields: Any) -> Machine:
    """A machine shared through a control file: `spec_with(base, **fields)`."""
    spec = spec_with(base, **fields, node="gpu-node-1")
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec_file, control = tmp_path / "spec.json", tmp_path / "control"
    spec_file.write_text(spec.model_dump_json())
    control.touch()
    shared_machine(control, spec)
    return Machine(spec, spec_file, control)


@contextmanager
def nvml_holder(on: Machine) -> Iterator[subprocess.Popen[str]]:
    """A child process with an NVML session open on the machine while the block runs
    (it shuts NVML down after, unless the block killed it)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(on.spec_file), str(on.control)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
        yield proc
    finally:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
        proc.wait(timeout=30)
