"""The controller's leader killed (SIGKILL: a crash, not a shutdown) in the middle of
a GPU reset, after the node's repair annotation says `resetting` and its Job's pod
runs, before the Job is done: the standby takes the Lease and carries on from what
the Node shows, so the repair completes exactly once: one Job, one GPU reset on the
machine, one Event per step, PASS."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.healthd import Healthd, eventually
from tests.e2e.repairs import REMAPPED_GPU, REPAIRED_S, repair_fleet, watching


def test_a_leader_killed_while_the_gpu_reset_runs_the_next_one_completes_it_once(
        healthd: Healthd, tmp_path: Path) -> None:
    with repair_fleet(healthd, tmp_path, 2, tag="leader") as fleet:
        node = fleet.nodes[0]
        fleet.kubelet.resets_allowed.clear()  # the reset pod runs, the reset waits
        with watching(fleet, [node]) as seen:
            fleet.remap_pending(node)
            eventually(lambda: fleet.state(node) == "resetting"
                       and fleet.reset_pods(node, "Running"), 90,
                       "the GPU-reset Job's pod running on the node")
            killed = fleet.leader()
            killed.program.kill()
            assert fleet.leader() is not killed  # the standby took the Lease
            fleet.kubelet.resets_allowed.set()
            eventually(lambda: fleet.repaired(node), REPAIRED_S, f"{node} repaired")

        assert fleet.attempts(node) == [("reset", [fleet.uuid(node)], "passed")]
        assert len(fleet.jobs()) == 1
        assert fleet.machines[node].resets() == [REMAPPED_GPU]
        assert seen.states(node) == [None, "resetting", "validating", ""]
        assert seen.events(node) == [("GPUReset", 1), ("RepairValidating", 1),
                                     ("RepairSucceeded", 1)]
