"""Frozen connections on the real API server: agents and the controller reach it
through a TCP proxy (TLS passes through unchanged) that silences every connection
established so far, both ways, with no FIN and no RST (a load-balancer failover, a
conntrack flush), while new connections are forwarded as usual.

Right after the freeze an on-demand request is answered (within the agent's watch
bound: its 60 s `timeoutSeconds` plus a 10 s read margin, then a round), the
controller keeps (or takes back) its Lease, renewed over a fresh connection, and an
XID still turns the node EVICT and gets its AppWrapper reset onto the other node."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from tests.e2e.conftest import Operator
from tests.e2e.healthd import NAMESPACE, Healthd, eventually
from tests.e2e.running_job import running_job
from tests.kube.freezing_proxy import ThreadedProxy, threaded_proxy
from tests.realcluster.cluster import ControlPlane

WATCH_BOUND_S = 60 + 10  # healthd.kube.client: WATCH_TIMEOUT_S + WATCH_READ_MARGIN_S


@pytest.fixture
def proxy(local_plane: ControlPlane, operator: Operator) -> Iterator[ThreadedProxy]:
    with threaded_proxy("127.0.0.1", local_plane.ports.apiserver) as running:
        yield running


def lease(healthd: Healthd) -> k8s.V1LeaseSpec:
    spec: k8s.V1LeaseSpec = k8s.CoordinationV1Api(healthd.client).read_namespaced_lease(
        "healthd-controller", NAMESPACE).spec
    return spec


def test_after_a_freeze_requests_are_answered_the_lease_kept_and_resets_done(
        healthd: Healthd, proxy: ThreadedProxy) -> None:
    job = running_job(healthd, "frozen", server=f"https://127.0.0.1:{proxy.port}")
    holder = eventually(lambda: lease(healthd).holder_identity, 30, "a Lease holder")

    assert proxy.freeze() >= 3  # two agents and the controller, each with its watches
    frozen_at = time.time()
    request_id = uuid.uuid4().hex[:8]
    healthd.core.patch_node(job.bad, {"metadata": {"annotations": {
        "healthd.io/run": "remapped", "healthd.io/run-id": request_id}}})
    eventually(lambda: request_id in (healthd.node(job.bad)["metadata"].get("annotations")
                                      or {}).get("healthd.io/last-run", ""),
               WATCH_BOUND_S + 30, "the on-demand request answered after the freeze")
    spec = lease(healthd)
    assert spec.holder_identity == holder
    assert spec.renew_time.timestamp() > frozen_at + 5  # renewed since, over a new connection
    job.evicted_and_reset()
