"""A stand-in for `nvidia-smi` on a simulated machine: `--gpu-reset` and `-pm`, as
strict as the real one.

It works on the machine a control file names (healthd.sim.shared): it opens that
machine as it stands now (the spec in its directory, the control lines so far, the
holders registered there) and changes it through the control file, so every process
on the machine (the agent's included) sees the change. Its own option comes first,
then the nvidia-smi arguments it stands in for (`-i` takes UUIDs or NVML indices,
comma-separated; without it, every GPU):

    python -m healthd.sim.nvidia_smi --control FILE --gpu-reset -i UUID
    python -m healthd.sim.nvidia_smi --control FILE -pm 0 -i UUID

`--gpu-reset` (`-r`) checks, in this order:

1. a GPU the machine does not have: "No devices were found", exit 6;
2. a GPU the reset cannot reach (lost from the bus): the driver's error, exit 1;
3. a GPU that cannot be reset now: listed under "The following GPUs could not be
   reset:" with why, exit 255, and no GPU is reset:
   - a GPU something holds (healthd.sim.holders: another process's NVML session, a
     busy fault's processes, persistence mode, a named holder): "In use by another
     client", with NVIDIA's advice after the list. Who holds it is not said: the real
     tool does not say either;
   - a MIG GPU that has GPU instances;
   - on a machine whose GPUs reset only together (`MachineSpec.resets_alone`), any
     reset that leaves some of them out;
4. otherwise each GPU is reset (healthd.sim.repairs; a `gpu_reset` control line
   each): "GPU 00000000:18:00.0 was successfully reset." per GPU, then "All done."

`-pm 0|1` turns persistence mode off or on (a `persistence` control line):
"Disabled persistence mode for GPU 00000000:18:00.0." or "Persistence mode is
already Disabled for GPU ...", then "All done."

The held refusal and the `-pm` lines are the real tool's words. No real output was
found for the MIG and topology refusals: their reasons are ours, in the same frame.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from healthd.sim.gpustate import GpuState
from healthd.sim.machine import MachineSpec, parse_machine_spec
from healthd.sim.nvmlsymbols import busy_pids
from healthd.sim.shared import spec_file

if TYPE_CHECKING:
    from healthd.sim.node import SimulatedNode

EXIT_NOT_FOUND = 6  # nvidia-smi: "No devices were found"
EXIT_FAILED = 1
EXIT_REFUSED = 255  # what the real tool exits with when a GPU is in use
IN_USE = "In use by another client"
MIG_INSTANCES = "MIG mode is enabled and GPU instances exist: destroy them first"
TOGETHER = ("cannot be reset alone on this system: reset all its GPUs together "
            "(nvidia-smi -r without -i)")


def command(control: Path) -> list[str]:
    """The command line (executable and its own option) standing in for nvidia-smi."""
    return [sys.executable, "-m", "healthd.sim.nvidia_smi", "--control", str(control)]


def machine_spec(control: Path) -> MachineSpec:
    """The spec of the machine `control` names (ValueError when there is none)."""
    marker = spec_file(control)
    try:
        return parse_machine_spec(json.loads(marker.read_text()), origin=str(marker))
    except (OSError, ValueError) as exc:
        raise ValueError(f"no simulated machine at {control}: {exc}") from None


def targets(node: SimulatedNode, ids: str | None) -> list[GpuState] | None:
    """The GPUs `ids` names (UUIDs or NVML indices), each once, in NVML order when
    unset; None when one is not there."""
    gpus = [s for s in map(node.nvml.state, range(node.spec.gpus.count)) if not s.missing]
    if ids is None:
        return gpus
    chosen: list[GpuState] = []
    for given in ids.split(","):
        given = given.strip()
        match = next((g for g in gpus if g.uuid == given), None)
        if match is None and given.isdigit() and int(given) < len(gpus):
            match = gpus[int(given)]
        if match is None:
            return None
        if match not in chosen:
            chosen.append(match)
    return chosen


def _lost(gpu: GpuState) -> str:
    return (f"Unable to determine the device handle for GPU {gpu.pci_bus_id}: "
            "GPU is lost.  Reboot the system to recover this GPU")


def held(node: SimulatedNode, gpu: int) -> bool:
    """Whether anything but this process holds `gpu` (healthd.sim.holders)."""
    holders = node.holders
    return bool(holders.nvml_sessions(exclude=os.getpid()) or holders.named(gpu)
                or busy_pids(node.nvml.state(gpu)) or node.nvml.persistence(gpu))


def why_not(node: SimulatedNode, gpu: GpuState, *, alone: bool) -> str:
    """Why `gpu` cannot be reset now ("" when it can); `alone`: without some of the
    machine's GPUs."""
    if alone and not node.spec.resets_alone():
        return TOGETHER
    if gpu.mig and gpu.gpu_instances:
        return MIG_INSTANCES
    return IN_USE if held(node, gpu.index) else ""


def refusal(reasons: dict[str, str]) -> str:
    """The tool's answer when GPUs (bus id -> why) cannot be reset."""
    lines = ["The following GPUs could not be reset:",
             *(f"  GPU {bus}: {why}" for bus, why in reasons.items())]
    in_use = sum(why == IN_USE for why in reasons.values())
    if in_use:
        devices, these = ("1 device is", "this device") if in_use == 1 else (
            f"{in_use} devices are", "these devices")
        lines += ["", f"{devices} currently being used by one or more other processes "
                  "(e.g., Fabric Manager, CUDA application, graphics application such as an "
                  "X server, or a monitoring application such as another instance of "
                  f"nvidia-smi). Please first kill all processes using {these} and all "
                  "compute applications running in the system."]
    return "\n".join(lines)


def reset(node: SimulatedNode, gpus: Sequence[GpuState]) -> tuple[int, str]:
    """Reset `gpus` of the machine (see the module docstring): exit status and output."""
    lost = next((g for g in gpus if g.lost), None)
    if lost is not None:
        return EXIT_FAILED, _lost(lost)
    every = {s.index for s in map(node.nvml.state, range(node.spec.gpus.count))
             if not s.missing}
    alone = {g.index for g in gpus} != every
    reasons = {g.pci_bus_id: why for g in gpus if (why := why_not(node, g, alone=alone))}
    if reasons:
        return EXIT_REFUSED, refusal(reasons)
    for gpu in gpus:
        node.change({"op": "gpu_reset", "gpu": gpu.index})
    done = [f"GPU {g.pci_bus_id} was successfully reset." for g in gpus]
    return 0, "\n".join([*done, "All done."])


def persistence(node: SimulatedNode, gpus: Sequence[GpuState], enabled: bool) -> tuple[int, str]:
    """`nvidia-smi -pm 0|1`: exit status and output."""
    lost = next((g for g in gpus if g.lost), None)
    if lost is not None:
        return EXIT_FAILED, _lost(lost)
    mode = "Enabled" if enabled else "Disabled"
    lines = []
    for gpu in gpus:
        if node.nvml.persistence(gpu.index) == enabled:
            lines.append(f"Persistence mode is already {mode} for GPU {gpu.pci_bus_id}.")
            continue
        node.change({"op": "persistence", "gpu": gpu.index, "enabled": enabled})
        lines.append(f"{mode} persistence mode for GPU {gpu.pci_bus_id}.")
    return 0, "\n".join([*lines, "All done."])


def run(control: Path, args: argparse.Namespace) -> tuple[int, str]:
    """What the tool does on the machine `control` names: exit status and output."""
    from healthd.sim.node import simulate  # late: node names this tool's command

    with simulate(machine_spec(control), control) as node:
        gpus = targets(node, args.id)
        if gpus is None:
            return EXIT_NOT_FOUND, "No devices were found"
        if args.gpu_reset:
            return reset(node, gpus)
        return persistence(node, gpus, args.persistence_mode == "1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi (simulated)")
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("-r", "--gpu-reset", action="store_true")
    parser.add_argument("-pm", "--persistence-mode", choices=["0", "1"])
    parser.add_argument("-i", "--id")
    args = parser.parse_args(argv)
    if args.gpu_reset == (args.persistence_mode is not None):
        print("only one of --gpu-reset and -pm is simulated at a time", file=sys.stderr)
        return 2
    try:
        code, text = run(args.control, args)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAILED
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
