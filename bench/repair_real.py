"""repair_real: from a GPU fault to the node PASS again, through healthd's repair chain on
the real control plane, and each step on the way.

The control plane of `tests/realcluster` with Kueue and the AppWrapper operator
(configured as the docs say beside healthd), healthd installed from its manifests,
two kwok GPU nodes whose agents and both controller replicas run as their Pods'
processes, and the e2e kubelet playing the GPU-reset Jobs on the simulated machines
(`tests/e2e/repairs.py`, the fleet of `tests/e2e/test_repairs.py`). Each run injects
a pending row remap (`REMAP_PENDING`, configured EVICT) on a node and times, from
watches, what the cluster shows:

- `busy`: the node runs an AppWrapper (one pod, 8 GPUs): fault -> EVICT label ->
  the AppWrapper `Resetting` -> the repair `resetting` (the pod has left; the GPU-reset
  Job created) -> the Job complete -> `validating` -> the label PASS;
- `idle`: no work on the node: fault -> EVICT -> `resetting` -> Job complete ->
  `validating` -> PASS.

The agents check every second (the tests' config; the shipped interval is 30 s, which
adds up to 30 s to fault -> EVICT) and the repair budget is raised so that repeated
runs on one node are not escalated to a reboot. No goal: the issue asks for the
figure.

    python bench/repair_real.py            # 5 runs of each
    python bench/repair_real.py --quick    # 1 of each
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import Goal, main, parser, summary
from real_api import running_plane, use_harness

if TYPE_CHECKING:  # the harness is imported once the control plane put it on the path
    from tests.e2e.recorders import Recorder
    from tests.e2e.repairs import RepairFleet, Watching

NAME = "repair_real"
RUNS = 5
CONFIG = {"controller": {"repair": {"max_gpu_resets": 1000}}}  # runs repeat on a node
JOB_STEPS = ("job", "job_to_pod_running", "reset_container", "pod_to_job_complete")
BUSY_STEPS = ("fault_to_evict", "evict_to_appwrapper_reset", "appwrapper_reset_to_job",
              *JOB_STEPS, "job_to_validating", "validation", "fault_to_pass")
IDLE_STEPS = ("fault_to_evict", "evict_to_job", *JOB_STEPS, "job_to_validating",
              "validation", "fault_to_pass")


@dataclass
class Jobs:
    """The GPU-reset Jobs (their outcome) and their pods (Job name, phase), as watches
    show them, timed."""

    jobs: Recorder
    pods: Recorder

    def steps(self, name: str) -> tuple[float, dict[str, float]]:
        """When Job `name` was complete, and its steps: created to complete, to its
        pod Running (Job controller, scheduler, kwok), the container's run (the
        simulated reset) and its pod Succeeded to the Job complete (Job controller)."""
        timed = self.jobs.timed(name)
        created = timed[0][1]
        done = next(at for outcome, at in timed if outcome == "succeeded")
        (pod,) = [p for p in self.pods.order if self.pods.values(p)[0][0] == name]
        phases = {phase: at for (_, phase), at in reversed(self.pods.timed(pod))}
        running, succeeded = phases["Running"], phases["Succeeded"]
        return done, {"job": done - created, "job_to_pod_running": running - created,
                      "reset_container": succeeded - running,
                      "pod_to_job_complete": done - succeeded}

    def stop(self) -> None:
        self.jobs.stop()
        self.pods.stop()


def _repaired(fleet: RepairFleet, node: str,
              inject: Callable[[str], None]) -> tuple[Watching, float]:
    """Inject the fault on `node` and wait until it is repaired; what was seen and
    when the fault was injected."""
    from tests.e2e.healthd import eventually
    from tests.e2e.repairs import REPAIRED_S, watching

    attempt = len(fleet.attempts(node)) + 1
    with watching(fleet, [node]) as seen:
        at = time.time()
        inject(node)
        eventually(lambda: fleet.repaired(node, attempt), REPAIRED_S, f"{node} repaired")
    return seen, at


def busy_run(fleet: RepairFleet, jobs: Jobs) -> dict[str, float]:
    from healthd.controller.reset_job import job_name
    from tests.e2e.healthd import eventually
    from tests.e2e.mlbatch import APPWRAPPERS, Workloads, appwrapper
    from tests.e2e.recorders import Recorder
    from tests.e2e.repairs import run_appwrapper

    name, node = run_appwrapper(fleet)
    group, version, plural = APPWRAPPERS
    phases = Recorder(fleet.healthd.client, partial(
        fleet.healthd.custom.list_namespaced_custom_object, group, version, "blue", plural),
        lambda aw: (aw.get("status") or {}).get("phase"), names=[name])
    try:
        seen, fault = _repaired(fleet, node, fleet.remap_pending)
    finally:
        phases.stop()
    job_done, job = jobs.steps(job_name(node, len(fleet.attempts(node))))
    evict = seen.when(node, verdict="EVICT")
    reset = next(at for phase, at in phases.timed(name) if phase == "Resetting")
    resetting, validating = seen.when(node, state="resetting"), seen.when(node, state="validating")
    passed = seen.when(node, verdict="PASS")
    fleet.healthd.applier.delete([appwrapper(name, "blue", pods=1, gpus_per_pod=8)])
    workloads = Workloads(fleet.healthd.client)
    eventually(lambda: not workloads.pods("blue", name), 60, "the job's pods gone")
    return {"fault_to_evict": evict - fault, "evict_to_appwrapper_reset": reset - evict,
            "appwrapper_reset_to_job": resetting - reset, **job,
            "job_to_validating": validating - job_done, "validation": passed - validating,
            "fault_to_pass": passed - fault}


def idle_run(fleet: RepairFleet, jobs: Jobs, node: str) -> dict[str, float]:
    from healthd.controller.reset_job import job_name

    seen, fault = _repaired(fleet, node, fleet.remap_pending)
    job_done, job = jobs.steps(job_name(node, len(fleet.attempts(node))))
    evict = seen.when(node, verdict="EVICT")
    validating, passed = seen.when(node, state="validating"), seen.when(node, verdict="PASS")
    return {"fault_to_evict": evict - fault,
            "evict_to_job": seen.when(node, state="resetting") - evict, **job,
            "job_to_validating": validating - job_done, "validation": passed - validating,
            "fault_to_pass": passed - fault}


def _job_and_phase(pod: dict[str, Any]) -> tuple[str, str]:
    return (pod["metadata"]["labels"].get("job-name", ""), pod["status"].get("phase", ""))


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    runs = 1 if args.quick else args.runs
    use_harness()
    with tempfile.TemporaryDirectory(prefix="healthd-bench-") as tmp:
        from tests.e2e.mlbatch import documented_operator_autopilot
        root = Path(tmp)
        with running_plane(root / "plane", operator=documented_operator_autopilot()) as plane:
            from kubernetes import client as k8s

            from healthd.config.controller import DEFAULT_REPAIR_NAMESPACE
            from healthd.controller.reset_job import job_outcome
            from tests.e2e.healthd import healthd_on
            from tests.e2e.kubelet import GPU_RESETS
            from tests.e2e.recorders import Recorder
            from tests.e2e.repairs import repair_fleet

            (root / "healthd").mkdir()
            with healthd_on(plane.admin_kubeconfig, root / "healthd") as healthd:
                healthd.install()
                with repair_fleet(healthd, root / "fleet", 2, config=CONFIG,
                                  tag="bench") as fleet:
                    jobs = Jobs(Recorder(healthd.client, partial(
                        k8s.BatchV1Api(healthd.client).list_namespaced_job,
                        DEFAULT_REPAIR_NAMESPACE), job_outcome, label_selector=GPU_RESETS),
                        Recorder(healthd.client, partial(
                            healthd.core.list_namespaced_pod, DEFAULT_REPAIR_NAMESPACE),
                            _job_and_phase, label_selector=GPU_RESETS))
                    try:
                        busy = [busy_run(fleet, jobs) for _ in range(runs)]
                        idle = [idle_run(fleet, jobs, fleet.nodes[i % 2]) for i in range(runs)]
                    finally:
                        jobs.stop()
    figures: dict[str, Any] = {
        "api_server": "kube-apiserver", "runs": runs, "check_interval_s": 1.0,
        "busy": {step: summary([r[step] for r in busy]) for step in BUSY_STEPS},
        "idle": {step: summary([r[step] for r in idle]) for step in IDLE_STEPS},
    }
    notes = ["seconds, from watches of the Node, the AppWrapper and the GPU-reset Jobs; "
             "the fault is the control-file line that injects it"]
    return figures, {}, notes


if __name__ == "__main__":
    cli = parser(__doc__ or NAME)
    cli.add_argument("--runs", type=int, default=RUNS,
                     help="runs of each kind (default %(default)s, --quick 1)")
    sys.exit(main(NAME, measure, cli.parse_args()))
