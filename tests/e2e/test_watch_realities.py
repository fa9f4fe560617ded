"""What a real control plane does to long-running clients, and that healthd converges
with nothing lost: the API server restarted after etcd compacted away the
resourceVersions the watches held (they resume with 410 Gone and must relist), and
etcd killed and restarted under a running API server."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, eventually
from tests.e2e.mlbatch import Workloads, appwrapper, tutorial
from tests.realcluster.cluster import ControlPlane


def _running(healthd: Healthd, tag: str) -> tuple[list[str], str, Workloads]:
    """Two nodes with agents, the controller, a job on the first node; (nodes, job)."""
    workloads = Workloads(healthd.client)
    healthd.applier.apply(tutorial())
    nodes = healthd.start_fleet(tag, 2)
    name = f"job-{uuid.uuid4().hex[:5]}"
    healthd.applier.apply([appwrapper(name, "blue", pods=1, gpus_per_pod=8)])
    eventually(lambda: len(workloads.running_nodes("blue", name)) == 1
               and workloads.phase("blue", name) == "Running", 120, "the job Running")
    return nodes, name, workloads


def _converges(healthd: Healthd, nodes: list[str], name: str, workloads: Workloads) -> None:
    """After the disruption: an on-demand request is answered, an XID still evicts, the
    job is reset off the node, and no verdict was lost meanwhile."""
    bad = workloads.running_nodes("blue", name)[0]
    other = next(n for n in nodes if n != bad)
    request_id = uuid.uuid4().hex[:8]
    healthd.core.patch_node(other, {"metadata": {"annotations": {
        "healthd.io/run": "remapped", "healthd.io/run-id": request_id}}})
    eventually(lambda: request_id in (healthd.node(other)["metadata"].get("annotations")
                                      or {}).get("healthd.io/last-run", ""),
               60, "the on-demand request answered")
    healthd.agents[bad].fault(op="emit_xid", gpu=2, code=79)
    eventually(lambda: healthd.label(bad) == "EVICT", 60, f"EVICT on {bad}")
    eventually(lambda: workloads.running_nodes("blue", name) == [other]
               and workloads.phase("blue", name) == "Running", 120,
               "the job reset and running on the healthy node")
    assert healthd.label(other) == "PASS"
    healthd.applier.delete([appwrapper(name, "blue", pods=1, gpus_per_pod=8)])


@pytest.fixture
def plane(local_plane: ControlPlane, operator: Operator) -> ControlPlane:
    return local_plane


def test_api_server_restart_after_compaction(healthd: Healthd, plane: ControlPlane) -> None:
    nodes, name, workloads = _running(healthd, "compact")
    # Changes the watches have not seen yet, then compaction past them, then a restart:
    # every watch comes back with a resourceVersion etcd no longer has.
    for i in range(5):
        healthd.core.patch_node(nodes[0], {"metadata": {"annotations": {
            "example.com/churn": str(i)}}})
    plane.compact_etcd()
    plane.restart("kube-apiserver")
    _converges(healthd, nodes, name, workloads)


def test_etcd_killed_and_restarted(healthd: Healthd, plane: ControlPlane) -> None:
    nodes, name, workloads = _running(healthd, "etcd")
    plane.restart("etcd", kill=True)
    _converges(healthd, nodes, name, workloads)
