"""The reboot hand-off on the real control plane: medik8s Self Node Remediation's
kinds installed in the API server (our CRDs), the admin's template, the controller
configured with it (`controller.repair.reboot`) and running as its ServiceAccount with
the manifests' RBAC (a read or create it refused would show as a `RebootRequestFailed`
Event, which the Events asserted leave no room for), and the fake reboot operator,
which reboots a requested node's simulated machine and reports the node's new boot id
as the kubelet would (tests/e2e/repairs.py).

(b) A fault that two GPU resets do not clear but a reboot does. The simulated GPU
keeps no such fault by itself (healthd.sim.repairs: a fault marked `hardware`
survives reboots too; everything else a reset clears, a reboot clears as well), so
the config makes one: the driver's recovery action NODE_REBOOT, which a GPU reset
does not carry out, is given the remedy `reset` (`controller.repair.remedies`, as an
admin who tries the cheap repair first would): two resets fail their validation,
each followed by the pause before the next attempt (`RepairWaiting`), then exactly
one reboot request is made from the template; the node reboots, its
request is deleted, it validates, PASS.

(c) A fault that survives reboots (a pending row remap on a GPU marked `hardware`):
two resets and `max_reboots` (1) reboots fail, then hardware inspection: the node
stays out (EVICT, its GPUs not lent), its repair annotation, condition, Event and the
leader's metric say so, and nothing more is tried."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.healthd import Healthd, eventually
from tests.e2e.repairs import (
    REBOOT_SPEC,
    REMAPPED_GPU,
    REPAIRED_S,
    RepairFleet,
    repair_fleet,
    watching,
)

# Quick checks of the driver's recovery action; one reboot before humans; a short
# pause after an attempt that did not pass (the default minute, doubled, would
# outlast the test).
REBOOT_CONFIG: dict[str, object] = {
    "checks": {"recovery": {"interval": "1s"}},
    "controller": {"repair": {"max_gpu_resets": 2, "max_reboots": 1, "attempt_pause": "5s",
                              "remedies": {"RECOVERY_NODE_REBOOT": "reset"}}},
}
# What the node shows of two GPU resets that did not clear the fault, each followed
# by the pause before the next attempt.
RESETS_FAILED = ["resetting", "validating", "", "waiting"] * 2
RESET_FAILED_EVENTS = [("GPUReset", 1), ("RepairValidating", 1), ("RepairFailed", 1),
                       ("RepairWaiting", 1)] * 2
CHAIN_S = 3 * REPAIRED_S  # two resets and a reboot, each validated
QUIET_S = 10  # how long the node in hardware inspection is watched for a new step
CONDITION = "GPUUnhealthy"


def condition_message(fleet: RepairFleet, node: str) -> str:
    conditions = fleet.healthd.node(node)["status"].get("conditions") or []
    found = next((c for c in conditions if c.get("type") == CONDITION), {})
    return str(found.get("message", ""))


def test_b_a_fault_two_resets_do_not_clear_is_rebooted_once_through_the_template(
        healthd: Healthd, tmp_path: Path) -> None:
    with repair_fleet(healthd, tmp_path, 1, config=REBOOT_CONFIG, tag="reboot",
                      reboots=True) as fleet:
        (node,) = fleet.nodes
        booted = fleet.boot_id(node)
        with watching(fleet, [node]) as seen:
            fleet.needs_reboot(node)
            eventually(lambda: fleet.repaired(node, attempt=3), CHAIN_S, f"{node} repaired")
            eventually(lambda: len(seen.lending()) > 1 and seen.lending()[-1] is None, 30,
                       "the node's GPUs lent again")

        assert fleet.attempts(node) == [("reset", [fleet.uuid(node)], "failed"),
                                        ("reset", [fleet.uuid(node)], "failed"),
                                        ("reboot", [], "passed")]
        # Out from the fault to PASS: EVICT, then TESTING while repaired (the agent may
        # show EVICT for a moment between two attempts); its 8 GPUs never lent meanwhile.
        verdicts = seen.verdicts(node)
        assert verdicts[:3] == ["PASS", "EVICT", "TESTING"] and verdicts[-1] == "PASS"
        assert set(verdicts[1:-1]) == {"EVICT", "TESTING"}, verdicts
        assert seen.lending() == [None, "8", None]
        assert seen.states(node) == [None, *RESETS_FAILED, "reboot-requested",
                                     "validating", ""]
        assert seen.events(node) == [*RESET_FAILED_EVENTS, ("RebootRequested", 1),
                                     ("RebootDone", 1), ("RepairSucceeded", 1)]
        (request,) = seen.requests(node)  # one request, ever, made from the template
        assert request["spec"] == REBOOT_SPEC
        assert request["labels"] == {"app.kubernetes.io/managed-by": "healthd"}
        assert fleet.requests() == []  # deleted once the node rebooted
        assert fleet.operator is not None and fleet.operator.rebooted == [node]
        assert fleet.boot_id(node) not in ("", booted)
        assert fleet.machines[node].resets() == [REMAPPED_GPU, REMAPPED_GPU]
        assert len(fleet.jobs()) == 2
        assert fleet.metric("healthd_controller_repairs_total", action="reset",
                            outcome="failed") == 2
        assert fleet.metric("healthd_controller_repairs_total", action="reboot",
                            outcome="started") == 1
        assert fleet.metric("healthd_controller_repairs_total", action="reboot",
                            outcome="passed") == 1


def test_c_a_fault_that_survives_reboots_goes_to_hardware_inspection_and_stays_out(
        healthd: Healthd, tmp_path: Path) -> None:
    with repair_fleet(healthd, tmp_path, 1, config=REBOOT_CONFIG, tag="hwinsp",
                      reboots=True) as fleet:
        (node,) = fleet.nodes
        with watching(fleet, [node]) as seen:
            fleet.remap_pending(node, hardware=True)
            eventually(lambda: fleet.state(node) == "hardware-inspection", CHAIN_S,
                       f"{node} in hardware inspection")
            eventually(lambda: fleet.metric(
                "healthd_controller_nodes_in_hardware_inspection") == 1, 30, "the gauge")
            eventually(lambda: "hardware inspection" in condition_message(fleet, node), 30,
                       "the node's condition says so")
            jobs, resets = len(fleet.jobs()), fleet.machines[node].resets()
            time.sleep(QUIET_S)  # an observation: nothing more is tried meanwhile
            assert len(fleet.jobs()) == jobs and fleet.machines[node].resets() == resets

        assert fleet.attempts(node) == [("reset", [fleet.uuid(node)], "failed"),
                                        ("reset", [fleet.uuid(node)], "failed"),
                                        ("reboot", [], "failed")]
        assert seen.verdicts(node) == ["PASS", "EVICT"]  # kept out, throughout and after
        assert seen.lending() == [None, "8"]  # 16 nominal; the node's 8 still withheld
        assert seen.states(node) == [None, *RESETS_FAILED, "reboot-requested",
                                     "validating", "", "hardware-inspection"]
        assert seen.events(node) == [*RESET_FAILED_EVENTS, ("RebootRequested", 1),
                                     ("RebootDone", 1), ("RepairFailed", 1),
                                     ("HardwareInspection", 1)]
        assert len(seen.requests(node)) == 1 and fleet.requests() == []
        assert fleet.operator is not None and fleet.operator.rebooted == [node]
        assert jobs == 2 and resets == [REMAPPED_GPU, REMAPPED_GPU]
        assert fleet.state(node) == "hardware-inspection"
        for action, outcome, times in (("reset", "failed", 2), ("reboot", "failed", 1),
                                       ("hardware-inspection", "started", 1)):
            assert fleet.metric("healthd_controller_repairs_total", action=action,
                                outcome=outcome) == times, (action, outcome)
