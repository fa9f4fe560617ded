"""A stand-in for `nvidia-smi --gpu-reset` on a simulated machine.

It resets GPUs of the machine a control file names (healthd.sim.shared): it opens
that machine as it stands now (the spec in its directory, the control lines so far),
finds each GPU by UUID, tries the reset there, and, when it succeeds, appends
`{"op": "gpu_reset", "gpu": N}` to the control file so every process on the machine
(the agent's included) sees the reset. It answers as nvidia-smi does:

    GPU 00000000:48:00.0 was successfully reset.
    All done.

and, for a GPU the reset cannot reach (lost from the bus, not enumerated), the
driver's error and exit 1; a UUID the machine does not have: "No devices were found",
exit 6. Its own option comes first, then the nvidia-smi arguments it stands in for:

    python -m healthd.sim.nvidia_smi --control FILE --gpu-reset -i UUID
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from healthd.sim.machine import MachineSpec, parse_machine_spec
from healthd.sim.shared import spec_file

EXIT_NOT_FOUND = 6  # nvidia-smi: "No devices were found"
EXIT_FAILED = 1


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


def reset(control: Path, uuid: str) -> tuple[int, str]:
    """Reset GPU `uuid` of the machine `control` names: exit status and output."""
    from healthd.sim.node import simulate  # late: installs the fake NVML library

    spec = machine_spec(control)
    index = next((i for i in range(spec.gpus.count) if spec.uuid(i) == uuid), None)
    if index is None:
        return EXIT_NOT_FOUND, "No devices were found"
    bus = spec.pci_bus_id(index)
    with simulate(spec, control) as node:
        if not node.nvml.reset_gpu(index):
            return EXIT_FAILED, (f"Unable to determine the device handle for GPU {bus}: "
                                 "GPU is lost.  Reboot the system to recover this GPU")
    with control.open("a") as handle:
        handle.write(json.dumps({"op": "gpu_reset", "gpu": index}) + "\n")
    return 0, f"GPU {bus} was successfully reset.\nAll done."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi (simulated)")
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("-r", "--gpu-reset", action="store_true")
    parser.add_argument("-i", "--id", required=True)
    args = parser.parse_args(argv)
    if not args.gpu_reset:
        print("only --gpu-reset is simulated", file=sys.stderr)
        return 2
    try:
        code, text = reset(args.control, args.id)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAILED
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
