"""What a real control plane does to long-running clients, and that healthd converges
with nothing lost: the API server restarted after etcd compacted away the
resourceVersions the watches held (the controller's resume, meet 410 Gone and relist,
the controller still leading; an agent's watch of its own Node lists it again at every
stream end, so it has nothing to resume), and etcd killed and restarted under a running
API server."""

from __future__ import annotations

import re
import uuid

import pytest

from healthd.controller.caches import KINDS
from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, Process, eventually, merge
from tests.e2e.running_job import running_job
from tests.realcluster.cluster import ControlPlane


def _answers_on_demand(healthd: Healthd, node: str) -> None:
    request_id = uuid.uuid4().hex[:8]
    healthd.core.patch_node(node, {"metadata": {"annotations": {
        "healthd.io/run": "remapped", "healthd.io/run-id": request_id}}})
    eventually(lambda: request_id in (healthd.node(node)["metadata"].get("annotations")
                                      or {}).get("healthd.io/last-run", ""),
               60, "the on-demand request answered")


# The watch's own words when it resumes from a version the server no longer has
# (`nodes`, `appwrappers.workload.codeflare.dev`).
RELISTED = re.compile(r"watch on ([\w-]+)\S* expired at version \S+: relisting")
# Long enough that the API server's restart never costs the controller its Lease: a
# lost Lease ends the term and its watches, and the next term lists afresh, so the
# resume after 410 Gone would go untried.
SURVIVING_LEASE = {"lease_duration": "60s", "renew_deadline": "45s", "retry_period": "1s"}


def relisted(process: Process) -> set[str]:
    """The resources whose watch met 410 Gone on resuming and relisted."""
    return {m.group(1) for message in process.messages() if (m := RELISTED.match(message))}


SYNCED = re.compile(r"cache of ([\w-]+) synced")


def synced(controller: Process) -> set[str]:
    """The kinds whose cache holds its first full list."""
    return {m.group(1) for message in controller.messages() if (m := SYNCED.match(message))}


def terms(controller: Process) -> list[str]:
    """The controller's messages about taking or losing its Lease."""
    return [m for m in controller.messages() if ": leading (Lease" in m
            or "lost the Lease" in m or "could not renew the Lease" in m]


@pytest.fixture
def plane(local_plane: ControlPlane, operator: Operator) -> ControlPlane:
    return local_plane


def test_api_server_restart_after_compaction(healthd: Healthd, plane: ControlPlane) -> None:
    healthd.config = merge(healthd.config, {"controller": {"election": SURVIVING_LEASE}})
    job = running_job(healthd, "compact")
    assert healthd.controller is not None
    controller, agents = healthd.controller, list(healthd.agents.values())
    # The job runs without the controller: wait until it leads with every cache synced,
    # so that its watches have versions to resume from.
    eventually(lambda: len(terms(controller)) == 1 and synced(controller) == set(KINDS), 60,
               "the controller leading with every cache synced")
    assert [relisted(p) for p in (controller, *agents)] == [set()] * (1 + len(agents))
    # Changes the watches have not seen yet, then compaction past them, then a restart:
    # every watch comes back with a resourceVersion etcd no longer has.
    for i in range(5):
        healthd.core.patch_node(job.other, {"metadata": {"annotations": {
            "example.com/churn": str(i)}}})
    plane.compact_etcd()
    plane.restart("kube-apiserver")
    _answers_on_demand(healthd, job.other)
    # The controller led throughout; every one of its caches resumed, met 410 Gone and
    # relisted. The agents re-read their Node instead (they answered above).
    assert len(terms(controller)) == 1, terms(controller)
    eventually(lambda: relisted(controller) == set(KINDS), 60,
               "relist after 410 Gone of every controller cache")
    job.evicted_and_reset()


def test_etcd_killed_and_restarted(healthd: Healthd, plane: ControlPlane) -> None:
    job = running_job(healthd, "etcd")
    plane.restart("etcd", kill=True)
    _answers_on_demand(healthd, job.other)
    job.evicted_and_reset()
