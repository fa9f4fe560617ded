"""A Node deleted and registered again (as its kubelet does), on the real API server:
the new Node carries none of healthd's keys, and the running agent puts its verdict
back within one check interval; the controller rebuilds its view of the Node, so an
XID on it afterwards still gets its AppWrapper reset onto the other node."""

from __future__ import annotations

from kubernetes import client as k8s

from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, eventually, gpu_node
from tests.e2e.running_job import running_job

INTERVAL_S = 1  # the checks' interval in the tests' config (tests.e2e.healthd)


def _gone(healthd: Healthd, name: str) -> bool:
    try:
        healthd.core.read_node(name)
    except k8s.ApiException as exc:
        return exc.status == 404
    return False


def test_a_node_registered_again_gets_its_label_back_and_resets_still_happen(
        healthd: Healthd, operator: Operator) -> None:
    job = running_job(healthd, "rereg")
    healthd.core.delete_node(job.bad)
    eventually(lambda: _gone(healthd, job.bad), 30, f"{job.bad} deleted")
    healthd.applier.apply([gpu_node(job.bad)])  # registered again, without healthd's keys
    uid = healthd.node(job.bad)["metadata"]["uid"]
    # Within one interval, and a few seconds for the round trips of a busy machine.
    eventually(lambda: healthd.label(job.bad) == "PASS"
               and "healthd.io/health" in (healthd.node(job.bad)["metadata"].get("annotations")
                                           or {}), INTERVAL_S + 10,
               f"the verdict back on the new {job.bad}")
    assert healthd.node(job.bad)["metadata"]["uid"] == uid  # the new Node, not the old one
    job.evicted_and_reset()
