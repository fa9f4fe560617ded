"""What a real control plane does to long-running clients, and that healthd converges
with nothing lost: the API server restarted after etcd compacted away the
resourceVersions the watches held (they resume with 410 Gone and must relist), and
etcd killed and restarted under a running API server."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, eventually
from tests.e2e.running_job import running_job
from tests.realcluster.cluster import ControlPlane


def _answers_on_demand(healthd: Healthd, node: str) -> None:
    request_id = uuid.uuid4().hex[:8]
    healthd.core.patch_node(node, {"metadata": {"annotations": {
        "healthd.io/run": "remapped", "healthd.io/run-id": request_id}}})
    eventually(lambda: request_id in (healthd.node(node)["metadata"].get("annotations")
                                      or {}).get("healthd.io/last-run", ""),
               60, "the on-demand request answered")


@pytest.fixture
def plane(local_plane: ControlPlane, operator: Operator) -> ControlPlane:
    return local_plane


def test_api_server_restart_after_compaction(healthd: Healthd, plane: ControlPlane) -> None:
    job = running_job(healthd, "compact")
    # Changes the watches have not seen yet, then compaction past them, then a restart:
    # every watch comes back with a resourceVersion etcd no longer has.
    for i in range(5):
        healthd.core.patch_node(job.other, {"metadata": {"annotations": {
            "example.com/churn": str(i)}}})
    plane.compact_etcd()
    plane.restart("kube-apiserver")
    _answers_on_demand(healthd, job.other)
    job.evicted_and_reset()


def test_etcd_killed_and_restarted(healthd: Healthd, plane: ControlPlane) -> None:
    job = running_job(healthd, "etcd")
    plane.restart("etcd", kill=True)
    _answers_on_demand(healthd, job.other)
    job.evicted_and_reset()
