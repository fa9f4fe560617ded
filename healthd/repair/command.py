"""`healthd gpu-reset UUID...`: reset GPUs in place, as the controller's GPU-reset Job
runs it on the node (healthd.controller.repairs).

For each GPU, `nvidia-smi --gpu-reset -i UUID` (one at a time: the driver resets one
GPU per call, and a failure on one must not hide the others' results). The result
goes to stdout and, with `--termination-log PATH` (the Job's /dev/termination-log),
as one line of JSON the controller reads back from the pod:

    {"ok": false, "gpus": [{"uuid": "GPU-...", "ok": true, "exit_code": 0,
                            "output": "GPU 00000000:48:00.0 was successfully reset."}]}

Exit status 0 only when every reset succeeded, 1 otherwise, 64 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from healthd.util.exits import UsageError

RESET_TIMEOUT_S = 120.0  # a reset that takes longer is stuck: the driver is wedged
OUTPUT_CHARS = 300  # per GPU, so the summary stays under the kubelet's 4096 bytes


class SimulatedMachine(Protocol):
    """What `healthd gpu-reset --sim` needs of a simulated machine
    (healthd.sim.node.SimulatedNode)."""

    def nvidia_smi(self) -> list[str]:
        """The command standing in for nvidia-smi there."""
        ...


Simulate = Callable[[str], AbstractContextManager[SimulatedMachine]]


@dataclass(frozen=True)
class GpuReset:
    uuid: str
    ok: bool
    exit_code: int | None  # None: it did not finish (timeout, cannot start)
    output: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uuids", nargs="+", metavar="UUID", help="GPUs to reset (GPU-...)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", metavar="PATH",
                        help="the nvidia-smi executable (default: from PATH)")
    parser.add_argument("--termination-log", metavar="PATH",
                        help="also write the result there as one line of JSON")
    parser.add_argument("--timeout", type=float, default=RESET_TIMEOUT_S, metavar="S",
                        help="seconds one GPU's reset may take")
    parser.add_argument("--sim", metavar="SPEC",
                        help="reset GPUs of a simulated machine (YAML file or bundled name)")
    parser.add_argument("--sim-control", metavar="FILE",
                        help="with --sim: the machine FILE names (healthd agent --sim-control)")


def reset_one(nvidia_smi: Sequence[str], uuid: str, timeout_s: float) -> GpuReset:
    """`nvidia-smi --gpu-reset -i UUID`: what it said and whether it succeeded."""
    try:
        proc = subprocess.run([*nvidia_smi, "--gpu-reset", "-i", uuid], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return GpuReset(uuid, False, None, f"no answer within {timeout_s:g} s")
    except OSError as exc:
        return GpuReset(uuid, False, None, f"cannot run {nvidia_smi[0]}: {exc}")
    output = (proc.stdout + proc.stderr).strip()[-OUTPUT_CHARS:]
    return GpuReset(uuid, proc.returncode == 0, proc.returncode, output)


def summary(results: Sequence[GpuReset]) -> str:
    """The one-line JSON result (see the module docstring)."""
    return json.dumps({"ok": all(r.ok for r in results), "gpus": [asdict(r) for r in results]},
                      separators=(",", ":"))


def run(args: argparse.Namespace, simulate: Simulate | None = None) -> int:
    if not all(u.startswith(("GPU-", "MIG-")) for u in args.uuids):
        raise UsageError("GPUs are named by UUID (GPU-...), as nvidia-smi -L shows them")
    if simulate is not None:
        with simulate(args.sim) as machine:
            results = [reset_one(machine.nvidia_smi(), u, args.timeout) for u in args.uuids]
    else:
        command = shlex.split(args.nvidia_smi)
        results = [reset_one(command, u, args.timeout) for u in args.uuids]
    for result in results:
        print(f"{result.uuid}: {'reset' if result.ok else 'FAILED'}: {result.output}")
    if args.termination_log:
        Path(args.termination_log).write_text(summary(results) + "\n")
    return 0 if all(r.ok for r in results) else 1
