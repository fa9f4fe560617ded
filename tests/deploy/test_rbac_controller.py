"""The controller's RBAC, proven by running it: the real controller talks to the API
emulator as its ServiceAccount with the manifests' Roles and bindings enforced. It
takes the Lease, syncs its caches, publishes ping's peers on the Nodes, resets an
AppWrapper on an EVICT node (re-reading
it after a refused write), lowers and restores the slack queue's lendingLimit
(re-reading the queue after a conflict), records Events, and hands the Lease over on
stop. No request may be denied and every rule entry must decide one."""

from __future__ import annotations

import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.rbac import RbacAuthorizer
from tests.controller.conftest import (
    KEYS,
    KubeFactory,
    appwrapper,
    controllers,
    default_flavor,
    events,
    eventually,
    gpu_limit,
    gpu_pod,
    kube_for,  # noqa: F401 - the fixture
    node,
    phase,
    set_verdict,
    settings,
    settled,
    slack_queue,
)
from tests.controller.test_peering import agent_pod
from tests.deploy.manifests import BASE, CONTROLLER, plain_resources

pytestmark = pytest.mark.anyio


async def test_the_controller_needs_every_rule_and_no_more(
        api: ApiEmulator, kube_for: KubeFactory) -> None:  # noqa: F811
    authz = RbacAuthorizer.from_manifests(plain_resources(BASE))
    api.authorizer = authz
    api.seed(node("n1"), node("n2"), appwrapper("a"), appwrapper("b"),
             gpu_pod("a", "n1"), gpu_pod("b", "n2"), default_flavor(), slack_queue(),
             agent_pod(0, "n1"), agent_pod(1, "n2"))
    # Someone else's write lands first, once on the AppWrapper and once on the queue.
    api.fail("PATCH", r"/apis/workload\.codeflare\.dev/.*/appwrappers/a/status", 409)
    api.fail("PATCH", r"/apis/kueue\.x-k8s\.io/.*/clusterqueues/.*", 409)
    async with controllers(kube_for, settings(), CONTROLLER) as (ctl,):
        await settled(ctl)
        await eventually(lambda: all(KEYS.peers in (api.get("Node", n) or {})["metadata"]
                                     .get("annotations", {}) for n in ("n1", "n2")))
        set_verdict(api, "n1", "EVICT", "XID_79")
        await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4",
                         within=10)
        await eventually(lambda: events(api, "NodeEvicted") and events(api, "AppWrapperReset"))
        set_verdict(api, "n1", "PASS")
        await eventually(lambda: gpu_limit(api) is None)
    assert [str(r) for r in authz.denied] == []
    assert authz.unused(CONTROLLER) == []
