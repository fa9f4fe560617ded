"""healthd installed with Helm, nodes held EVICT, ERR and WARN (and one PASS): a `helm
upgrade` that changes only one check interval rolls every agent and the controller
(the config's checksum is on their Pod templates), and changes nothing a user or
Kueue can see: no label or GPUUnhealthy condition changes even for a moment, healthd
writes nothing to the Nodes, no Event is sent, the slack queue's lendingLimit stays.

Runs on the session's own control plane: Helm takes over nothing it did not make, so
the kustomize installation the other e2e tests use is removed first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.chart import CHART, VALUES, helm, helm_binary
from tests.e2e.fleet import (
    FABRIC,
    FLEET_CONFIG,
    HEALTHY,
    QUICK_CHECKS,
    REPLACED_S,
    SETTLED_RUNS,
    SLOWDOWN,
    XID_NVML,
    Fleet,
    assert_nothing_moved,
    held_fleet,
    watching,
)
from tests.e2e.healthd import (
    NAMESPACE,
    SYSTEM_NODES,
    TEST_CONFIG,
    eventually,
    healthd_on,
    merge,
    system_node,
)
from tests.e2e.kubelet import agents_replaced
from tests.realcluster.cluster import ControlPlane

RELEASE = "healthd"
HELD = (XID_NVML, FABRIC, SLOWDOWN, HEALTHY)  # EVICT, ERR, WARN, PASS
ONE_INTERVAL = "checks.intervals.nic=45s"  # shipped: 60s
Helm = Callable[..., None]  # helm with these arguments, on the session's control plane


@pytest.fixture
def helm_fleet(local_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[Fleet, Helm]]:
    binary = helm_binary()
    kubeconfig = local_plane.admin_kubeconfig

    def run(*args: str) -> None:
        helm(binary, *args, "--kubeconfig", str(kubeconfig))

    values = tmp_path / "test-clocks.yaml"
    values.write_text(yaml.safe_dump({"config": merge(TEST_CONFIG, FLEET_CONFIG)}))
    with healthd_on(kubeconfig, tmp_path) as healthd:
        healthd.uninstall()
        run("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
            "-f", str(VALUES / "device-plugin.yaml"), "-f", str(values))
        try:
            healthd.applier.apply(system_node(name) for name in SYSTEM_NODES)
            with held_fleet(healthd, HELD, tmp_path) as fleet:
                yield fleet, run
        finally:
            run("uninstall", RELEASE, "-n", NAMESPACE, "--wait")


def test_a_helm_upgrade_of_one_interval_changes_nothing(
        helm_fleet: tuple[Fleet, Helm]) -> None:
    fleet, helm_run = helm_fleet
    agents, controllers = fleet.agents(), {c.uid for c in fleet.kubelet.controllers()}
    with watching(fleet) as seen:
        helm_run("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
                 "--set", ONE_INTERVAL)
        agents_replaced(fleet.kubelet, agents, QUICK_CHECKS, SETTLED_RUNS, REPLACED_S)
        eventually(lambda: len(now := fleet.kubelet.controllers()) == len(controllers)
                   and all(c.ready() and c.uid not in controllers for c in now),
                   REPLACED_S, "the controller's Pods replaced and ready")
    assert_nothing_moved(seen, f"a helm upgrade --set {ONE_INTERVAL}")
    assert not fleet.holds()
