"""pciebw_child: what the pciebw check's child process costs, per GPU measurement.

The check measures each GPU in a short-lived child (checks.cuda_child, started by
checks.pciebw_probe), so the agent never holds a CUDA context or a pinned buffer. The
child runs in the agent's container, so its peak counts against the agent's memory
limit while it runs. This runs the child as the check does, one after the other, and
takes from each: the time from start to exit (what one GPU's measurement costs beyond
its copies), and its peak RSS (`ru_maxrss` from wait4, the child's own, started from
a small launcher so that the parent's pages are not counted).

- `cuda_child`: the real child program. Without a CUDA driver it answers "CUDA driver
  not found" right after starting: what is measured is the interpreter and its
  imports, the part the simulation cannot add the driver to. With a GPU, the whole
  measurement of GPU 0 (context, pinned buffer, copies).
- `sim_child`: the simulated machine's child (healthd.sim.cuda_child), started the
  same way, holding a buffer of the copy's size: what the simulation's agent runs.

    python bench/pciebw_child.py            # 50 runs of each
    python bench/pciebw_child.py --quick    # 5 runs
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from common import Goal, main, parser, summary

from checks.cuda_child import decode
from checks.pciebw import MIB, PcieBwParams
from checks.pciebw_probe import cuda_child_command

NAME = "pciebw_child"
# The interpreter's share of the child: what the memory limit's arithmetic allows for
# it (deploy/daemonset/base/agent-daemonset.yaml).
INTERPRETER_GOAL_MIB = 16.0


# The children start from this small parent, not from the benchmark: the peak RSS that
# wait4 reports counts the parent's pages at fork (a vfork'd exec records the parent's
# whole RSS), so from a parent of tens of MiB every child would seem that big.
LAUNCHER = (
    "import os, sys, time\n"
    "started = time.perf_counter()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "took = time.perf_counter() - started\n"
    "print(os.waitstatus_to_exitcode(status), took, usage.ru_maxrss, file=sys.stderr)\n"
)


def run_child(argv: Sequence[str]) -> tuple[float, float, str]:
    """Run `argv` from the launcher: (seconds from fork to reaped, its peak RSS in
    MiB, its answer)."""
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, *argv],
                          capture_output=True, text=True, timeout=120, check=True)
    code, took, peak_kib = proc.stderr.split()[-3:]
    if int(code) != 0:
        raise RuntimeError(f"the child exited with {code}: {proc.stderr[-500:]}")
    return float(took), int(peak_kib) / 1024, proc.stdout


def gpu0_bus_id() -> str | None:
    """GPU 0's PCI bus id, when NVML sees a GPU here."""
    from checks.nvml_reader import NvmlReader

    reader = NvmlReader()
    try:
        snapshot = reader.read()
    finally:
        reader.close()
    return snapshot.gpus[0].pci_bus_id if snapshot.gpus else None


def sim_command(size_bytes: int) -> list[str]:
    from healthd.sim.cuda import SimBandwidthProbe
    from healthd.sim.machine import parse_machine_spec

    spec = parse_machine_spec({"gpus": {"count": 1}})
    return list(SimBandwidthProbe(spec).command(spec.pci_bus_id(0), size_bytes, 5))


def costs(argv: Sequence[str], runs: int) -> dict[str, Any]:
    seconds, peaks, answers = [], [], set()
    for _ in range(runs):
        took, peak, answer = run_child(argv)
        seconds.append(took)
        peaks.append(peak)
        answer_of = decode(answer)
        answers.add(answer_of.error or "measured")
    return {"runs": runs, "start_to_exit_s": summary(seconds), "peak_rss_mib": summary(peaks),
            "answers": sorted(answers)}


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    runs = 5 if args.quick else 50
    size = PcieBwParams().size_mib * MIB
    bus_id = gpu0_bus_id()
    real = costs(cuda_child_command(bus_id or "00000000:18:00.0", size, 5), runs)
    real["gpu"] = bus_id is not None
    sim = costs(sim_command(size), runs)
    figures = {"size_mib": size // MIB, "cuda_child": real, "sim_child": sim}
    goals = {}
    if bus_id is None:  # without a GPU, the real child's cost is its interpreter's
        goals["interpreter_peak_rss_mib"] = Goal(real["peak_rss_mib"]["max"],
                                                 INTERPRETER_GOAL_MIB)
    return figures, goals, [
        "start_to_exit_s: spawn to reaped, one child per GPU measurement; peak_rss_mib: "
        "the child's own VmHWM (wait4 ru_maxrss)",
        "cuda_child without a GPU stops at 'CUDA driver not found': the interpreter and "
        "checks.cuda only; the CUDA context and pinned buffer come on top on a GPU node",
        f"sim_child holds a {size // MIB} MiB buffer, as the real child holds its pinned one",
    ]


if __name__ == "__main__":
    sys.exit(main(NAME, measure, parser(__doc__.splitlines()[0]).parse_args()))
