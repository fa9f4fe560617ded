"""etcd restored from a backup taken before a node went EVICT: the cluster shows the
backup's world again (the node PASS, its AppWrapper Running on it, the slack queue
lending the node's GPUs), while the node is as broken as before and its agent knows
it. Within one watch period healthd puts it right: the EVICT label is back, the
AppWrapper is reset again (and the real operator carries the reset out), and the
lendingLimit is what capacity says.

The restore follows the Kubernetes docs: the API server and etcd stopped, the backup
put in place, both started, and the components that cache the API restarted (the
controller manager, the scheduler, the kubelets, Kueue, the AppWrapper operator);
healthd's agent and controller keep running and must notice by themselves. The nodes
are kept alive as kubelets keep theirs (a Lease; the Node's status reported every 5
minutes), so nothing else writes the Node for a while: the restored server's
resourceVersions soon pass the ones healthd last saw, and no new event shows the
restored Node; only comparing what the objects say, not their versions, finds it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client as k8s

from healthd.kube.client import WATCH_READ_MARGIN_S, WATCH_TIMEOUT_S
from healthd.kube.conventions import Reason
from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, eventually
from tests.e2e.mlbatch import Workloads, appwrapper
from tests.e2e.running_job import RunningJob, running_job
from tests.realcluster.cluster import CACHING_COMPONENTS, KUBELET_HEARTBEAT, ControlPlane

# The longest an agent's or the controller's watch goes without a word from the server
# before it is renewed, and a margin for a busy 2-core machine.
ONE_WATCH_PERIOD_S = WATCH_TIMEOUT_S + WATCH_READ_MARGIN_S + 20
OPERATOR_S = 120  # the operator's own clocks: resetPause, its requeues
LENT_WHILE_EVICT = "8"  # the tutorial's 16 slack GPUs less the EVICT node's 8


@pytest.fixture
def plane(local_plane: ControlPlane, operator: Operator) -> ControlPlane:
    return local_plane


def _marker(healthd: Healthd) -> Callable[[], bool]:
    """A ConfigMap written now; the returned probe tells whether it still exists (after
    a restore from a backup taken before now, it does not)."""
    name = f"after-backup-{uuid.uuid4().hex[:6]}"
    healthd.core.create_namespaced_config_map("default", k8s.V1ConfigMap(
        metadata=k8s.V1ObjectMeta(name=name)))

    def exists() -> bool:
        try:
            healthd.core.read_namespaced_config_map(name, "default")
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
    return exists


def test_a_restored_etcd_gets_the_evict_label_the_reset_and_the_lending_back(
        healthd: Healthd, plane: ControlPlane, tmp_path: Path) -> None:
    healthd.node_annotations = dict([KUBELET_HEARTBEAT])
    job = running_job(healthd, "restore")
    try:
        _restored_and_recovered(healthd, plane, job, tmp_path / "etcd-backup")
    finally:
        healthd.applier.delete([appwrapper(job.name, "blue", pods=1, gpus_per_pod=8)])


def _restored_and_recovered(healthd: Healthd, plane: ControlPlane, job: RunningJob,
                            backup_dir: Path) -> None:
    workloads = Workloads(healthd.client)
    assert healthd.label(job.bad) == "PASS" and workloads.lending_limit() is None
    backup = plane.backup_etcd(backup_dir)
    after_backup = _marker(healthd)

    healthd.agents[job.bad].fault(op="emit_xid", gpu=2, code=79)
    eventually(lambda: healthd.label(job.bad) == "EVICT", 60, f"EVICT on {job.bad}")
    eventually(lambda: workloads.running_nodes("blue", job.name) == [job.other]
               and workloads.phase("blue", job.name) == "Running", OPERATOR_S,
               "the job reset and running on the healthy node")
    eventually(lambda: workloads.lending_limit() == LENT_WHILE_EVICT, 30,
               f"lendingLimit {LENT_WHILE_EVICT}")

    back = plane.restore_etcd(backup, restart=CACHING_COMPONENTS)
    assert not after_backup(), "the restore did not take the cluster back to the backup"

    def reset_again() -> bool:
        """healthd's Event of a reset (the first one went with the restore)."""
        events = healthd.core.list_namespaced_event(
            "blue", field_selector=f"involvedObject.name={job.name}").items
        return any(e.reason == Reason.NODE_EVICTED for e in events)

    wanted = {"the EVICT label": lambda: healthd.label(job.bad) == "EVICT",
              "the AppWrapper reset again": reset_again,
              f"lendingLimit {LENT_WHILE_EVICT}":
                  lambda: workloads.lending_limit() == LENT_WHILE_EVICT}
    missing = _still_missing(wanted, deadline=back + ONE_WATCH_PERIOD_S)
    assert not missing, (f"{ONE_WATCH_PERIOD_S} s after the restored API server answered, "
                         f"still missing: {', '.join(missing)} (label "
                         f"{healthd.label(job.bad)}, lendingLimit "
                         f"{workloads.lending_limit()}, AppWrapper "
                         f"{workloads.phase('blue', job.name)} on "
                         f"{workloads.running_nodes('blue', job.name)})")
    eventually(lambda: workloads.running_nodes("blue", job.name) == [job.other]
               and workloads.phase("blue", job.name) == "Running", OPERATOR_S,
               "the operator's reset carried out: the job running on the healthy node")


def _still_missing(wanted: dict[str, Callable[[], bool]], deadline: float) -> list[str]:
    """Which of `wanted` have not been true (each once is enough) by `deadline`."""
    pending = dict(wanted)
    while pending and time.monotonic() < deadline:
        for what, probe in list(pending.items()):
            try:
                if probe():
                    del pending[what]
            except k8s.ApiException:
                pass
        time.sleep(0.5)
    return list(pending)
