"""demo_repair: the time from a GPU fault to PASS in the `gpu-repair` demo scenario,
the repair chain end to end with no admin step.

Each run is `healthd demo --scenario gpu-repair --output json` in a process of its
own, as a user runs it: the API emulator, three real agents on simulated machines, the
real controller with repairs on, the AppWrapper operator stand-in, and the fake
kubelet running the GPU-reset Job's own `healthd gpu-reset` on the node's machine.
From each run's marks (healthd/demo/scenarios/gpu-repair.yaml): fault -> PASS (the
scenario's `fault_to_pass` timing), each mark of the chain since the fault, and the
GPU-reset Job alone (GPUReset Event -> RepairValidating Event: the fake scheduler,
then `healthd gpu-reset` and the simulated nvidia-smi it calls, two Python processes),
which dominates. Marks come from the demo's samples, every 0.1 s.

    python bench/demo_repair.py              # 10 runs
    python bench/demo_repair.py --quick      # 1 run
    python bench/demo_repair.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from common import REPO, Goal, main, parser, summary

NAME = "demo_repair"
SCENARIO = "gpu-repair"
TIMING = "fault_to_pass"
START, JOB, JOB_DONE = "fault", "reset-job", "reset-done"
RUN_TIMEOUT_S = 180.0


def play() -> dict[str, Any]:
    """One `healthd demo --output json` run of the scenario, parsed."""
    proc = subprocess.run([sys.executable, "-m", "healthd", "demo", "--scenario", SCENARIO,
                           "--output", "json"], cwd=REPO, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def in_order(marks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The marks' summaries by their medians: the order the chain ran in."""
    return dict(sorted(marks.items(), key=lambda item: item[1]["p50"]))


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    runs = 1 if args.quick else args.runs
    load_before = os.getloadavg()
    results = [play() for _ in range(runs)]
    passed = [r for r in results if r["passed"]]
    since: dict[str, list[float]] = {}
    for result in passed:
        marks = result["marks"]
        for mark, t in marks.items():
            since.setdefault(mark, []).append(t - marks[START])
    figures = {
        "runs": runs,
        "passed": len(passed),
        "failures": [r["failure"] for r in results if not r["passed"]],
        TIMING: summary([r["timings"][TIMING] for r in passed]),
        "reset_job_s": summary([r["marks"][JOB_DONE] - r["marks"][JOB] for r in passed]),
        "since_fault": in_order({mark: summary(values) for mark, values in since.items()}),
        "duration_s": summary([r["duration_s"] for r in results]),
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }
    return figures, {}, [
        f"{TIMING}: the scenario's timing, fault step -> node PASS (the label seen)",
        "reset_job_s: GPUReset Event (the Job created) -> RepairValidating Event (the "
        "Job complete, seen by the controller)",
        "since_fault: each mark's time after the fault, in the order of their medians; "
        "a state's mark is the first sample (every 0.1 s) that showed it",
        "wall-clock figures: they depend on the machine's load (load_average)",
    ]


def arguments() -> argparse.Namespace:
    out = parser(__doc__.splitlines()[0])
    out.add_argument("--runs", type=int, default=10, help="how many times to play it")
    return out.parse_args()


if __name__ == "__main__":
    sys.exit(main(NAME, measure, arguments()))
