"""The repair chain on the real control plane (Kueue and the AppWrapper operator as the
docs configure it beside healthd): a GPU's pending row remap under a running
AppWrapper ends with the node PASS again and its GPUs lent again, and nobody but
healthd did anything: the node EVICT, the AppWrapper reset (the operator carries it
out: the job runs on the other node), a GPU-reset Job run on the node by the real Job
controller (its `healthd gpu-reset` resetting the GPU of the node's machine), the
node's agent validating it, PASS. One Event on the Node per step, in order."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, eventually
from tests.e2e.mlbatch import PhaseRecorder, Workloads
from tests.e2e.repairs import (
    REMAPPED_GPU,
    REPAIRED_S,
    repair_fleet,
    run_appwrapper,
    watching,
)


def test_a_pending_remap_under_a_running_appwrapper_is_repaired_without_an_admin(
        healthd: Healthd, operator: Operator, tmp_path: Path) -> None:
    with repair_fleet(healthd, tmp_path, 2) as fleet:
        name, bad = run_appwrapper(fleet)
        (other,) = [n for n in fleet.nodes if n != bad]
        workloads = Workloads(healthd.client)
        phases = PhaseRecorder(healthd.client, "blue", name)
        try:
            with watching(fleet, [bad]) as seen:
                fleet.remap_pending(bad)
                eventually(lambda: fleet.repaired(bad), REPAIRED_S, f"{bad} repaired")
                eventually(lambda: workloads.running_nodes("blue", name) == [other]
                           and workloads.phase("blue", name) == "Running", 60,
                           "the job running on the other node")
                eventually(lambda: len(seen.lending()) > 1 and seen.lending()[-1] is None, 30,
                           "the node's GPUs lent again")
        finally:
            phases.stop()

        assert seen.verdicts(bad) == ["PASS", "EVICT", "TESTING", "PASS"]
        # The repair usually looks at the node before the pod leaves (healthd's reset
        # goes through the operator, which deletes it): then it waits, once, and says so.
        waited = "waiting" in seen.states(bad)
        assert seen.states(bad) == [None, *["waiting"] * waited, "resetting", "validating", ""]
        assert seen.lending() == [None, "8", None]  # 16 nominal; the node's 8 withheld
        assert phases.resets() == 1
        assert fleet.attempts(bad) == [("reset", [fleet.uuid(bad)], "passed")]
        (job,) = fleet.jobs()
        assert job["status"].get("succeeded") == 1
        assert fleet.machines[bad].resets() == [REMAPPED_GPU]
        assert fleet.machines[other].resets() == []
        assert seen.events(bad) == [*[("RepairWaiting", 1)] * waited, ("GPUReset", 1),
                                    ("RepairValidating", 1), ("RepairSucceeded", 1)]
        assert fleet.metric("healthd_controller_repairs_total", action="reset",
                            outcome="passed") == 1
