"""A GPU reset on a node where the NVIDIA GPU Operator runs its operands, on the real
control plane: the operator's DaemonSets (device plugin, DCGM, dcgm-exporter, GPU
Feature Discovery), run by the real DaemonSet controller, each pod holding the node's
simulated GPUs while it runs (tests/e2e/operands.py), so that the simulated
`nvidia-smi --gpu-reset` refuses a GPU while they run, as a real one does.

A pending row remap is repaired as a user expects: the controller pauses the operands'
labels, the DaemonSet controller deletes their pods from that node alone, the GPU is
reset once they have let go, the labels are put back and the pods come back; the
repair passes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from healthd.sim.operands import NAMESPACE, OPERANDS
from tests.e2e.healthd import Healthd, eventually
from tests.e2e.kubelet import Machine
from tests.e2e.operands import EVERY_OPERAND, Change, gpu_holders, gpu_operator, operand_labels_of
from tests.e2e.repairs import REMAPPED_GPU, REPAIRED_S, repair_fleet, watching

OPERAND_HOLDER = re.compile(rf"\({NAMESPACE}/(.+)-[a-z0-9]+\)")  # "pid N (gpu-operator/pod)"


def operands_holding(machine: Machine, uuid: str) -> list[str]:
    """The operands whose pods hold GPU `uuid` of `machine` now."""
    return sorted(m[1] for h in gpu_holders(machine, uuid) if (m := OPERAND_HOLDER.search(h)))


def holds_and_resets(machine: Machine) -> list[str]:
    """What the machine saw of the operands' holds and of GPU resets, in the order it
    happened (its control file's lines): `hold`, `release`, `reset GPU`."""
    out = []
    for line in machine.control.read_text().splitlines():
        command = json.loads(line)
        if command["op"] in ("hold", "release") and command["name"].startswith(f"{NAMESPACE}/"):
            out.append(command["op"])
        elif command["op"] == "gpu_reset":
            out.append(f"reset {command['gpu']}")
    return out


def test_the_operands_leave_the_node_for_its_gpu_reset_and_come_back(
        healthd: Healthd, tmp_path: Path) -> None:
    with repair_fleet(healthd, tmp_path, 2, tag="operands") as fleet, \
            gpu_operator(fleet) as pods:
        bad, other = fleet.nodes
        # Each operand's pod holds the GPU to be reset: a reset now would be refused.
        assert operands_holding(fleet.machines[bad], fleet.uuid(bad)) == sorted(OPERANDS)
        start = {node: len(pods.changes(node)) - 1 for node in fleet.nodes}
        with watching(fleet, [bad]) as seen:
            fleet.remap_pending(bad)
            eventually(lambda: fleet.repaired(bad), REPAIRED_S, f"{bad} repaired")
            eventually(lambda: pods.running(bad) == sorted(OPERANDS)
                       and pods.holding(bad) == len(OPERANDS), 60,
                       f"one pod of each operand running on {bad} again")

        # The DaemonSet controller deleted the operands' pods from the node while it was
        # resetting, one by one, and made them again once the repair had left it.
        changes = pods.changes(bad)[start[bad]:]
        assert [len(c.operands) for c in changes] == [4, 3, 2, 1, 0, 1, 2, 3, 4], changes
        assert {c.state for c in changes[1:5]} == {"resetting"}, changes
        assert {c.state for c in changes[5:]} <= {"validating", ""}, changes
        assert changes[-1].operands == EVERY_OPERAND
        assert operand_labels_of(healthd, bad) == dict.fromkeys(OPERANDS.values(), "true")
        # The other node's operands never left.
        assert pods.changes(other)[start[other]:] == [Change(EVERY_OPERAND, None)]
        assert operand_labels_of(healthd, other) == dict.fromkeys(OPERANDS.values(), "true")
        # The GPU was reset once every operand pod had let go of it, then they held it
        # again; the other machine's were never let go of, nor its GPUs reset.
        assert holds_and_resets(fleet.machines[bad]) == [
            *["hold"] * 4, *["release"] * 4, f"reset {REMAPPED_GPU}", *["hold"] * 4]
        assert holds_and_resets(fleet.machines[other]) == ["hold"] * 4

        assert seen.states(bad) == [None, "resetting", "validating", ""]
        assert seen.events(bad) == [("GPUReset", 1), ("RepairValidating", 1),
                                    ("RepairSucceeded", 1)]
        assert fleet.label(bad) == "PASS"
        assert fleet.attempts(bad) == [("reset", [fleet.uuid(bad)], "passed")]
        repair = fleet.repair(bad)
        assert repair is not None and "operands" not in repair
        (job,) = fleet.jobs()
        assert job["status"].get("succeeded") == 1
        assert fleet.machines[bad].resets() == [REMAPPED_GPU]
        assert fleet.machines[other].resets() == []
