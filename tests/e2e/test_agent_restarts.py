"""A rolling restart of every agent (`kubectl rollout restart daemonset/healthd-agent`:
each agent replaced by a new process in a new Pod with a new token) on nodes that
healthd holds EVICT, ERR and WARN, one node per kind of evidence, changes nothing a
user or Kueue can see: no label or GPUUnhealthy condition changes even for a moment,
healthd writes nothing to the Nodes, no Event is sent, the slack queue's lendingLimit
stays. The published state is the agent's memory: evidence that came once (a live
NVML XID 79, a kernel-log line already read) is not seen again by the new agent.

Across one restart and across two in a row; the fleet is set up once for both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.fleet import (
    DCGM,
    FABRIC,
    FLEET_CONFIG,
    HEALTHY,
    RDMA_DOWN,
    RDMA_SLOW,
    REMAP,
    SLOWDOWN,
    SXID_LOG,
    XID_LOG,
    XID_NVML,
    Fleet,
    assert_nothing_moved,
    held_fleet,
    rollout_restart,
    watching,
)
from tests.e2e.healthd import TEST_CONFIG, healthd_on, merge

EVERY_FAMILY = (XID_NVML, XID_LOG, SXID_LOG, DCGM, REMAP, FABRIC, RDMA_DOWN, RDMA_SLOW,
                SLOWDOWN, HEALTHY)


@pytest.fixture(scope="module")
def fleet(e2e_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("restarts")
    with healthd_on(e2e_kubeconfig, root) as healthd:
        healthd.install()
        with held_fleet(healthd, EVERY_FAMILY, root,
                        config=merge(TEST_CONFIG, FLEET_CONFIG)) as held:
            yield held


@pytest.mark.parametrize("restarts", [1, 2], ids=["one-restart", "two-restarts-in-a-row"])
def test_a_rolling_restart_of_every_agent_changes_nothing(fleet: Fleet, restarts: int) -> None:
    assert not fleet.holds(), f"the fleet is not in its states to begin with: {fleet.holds()}"
    with watching(fleet) as seen:
        rollout_restart(fleet, times=restarts)
    assert_nothing_moved(seen, f"{restarts} rolling restart(s) of every agent")
    assert not fleet.holds()
