"""The controller's RBAC, proven by running it: the real controller talks to the API
emulator as its ServiceAccount with the manifests' Roles and bindings enforced. It
takes the Lease, syncs its caches, publishes ping's peers on the Nodes, resets an
AppWrapper on an EVICT node (re-reading it after a refused write), lowers and
restores the slack queue's lendingLimit (re-reading the queue after a conflict),
starts a GPU reset on a node with a pending row remap (its repair annotation, the Job
in the repair namespace, which it follows, and the failed Job's pod, which says why),
requests a reboot of a node whose GPU fell off the bus (the remediation template, the
request made from it, deleted once the node's boot id changed), records Events, and
hands the Lease over on stop. No request may be denied and every rule entry must
decide one."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.rbac import RbacAuthorizer
from healthd.sim.remediation import template
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
from tests.controller_repairs.conftest import agent_lets_go
from tests.deploy.manifests import BASE, CONTROLLER, plain_resources

Obj = dict[str, Any]


def fail_job(api: ApiEmulator) -> None:
    (job,) = api.list("Job", "healthd-system-repair")
    job["status"] = {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    api.put(job)


def remap_pending(name: str) -> Obj:
    """A node whose agent holds REMAP_PENDING on GPU 3: a GPU reset is due."""
    held = {"code": "REMAP_PENDING", "check": "remapped", "entity": "gpu3",
            "severity": "ERR", "sticky": False, "message": "", "since": "2026-01-01T00:00:00Z",
            "uuid": "GPU-00000003-0000-4000-8000-000000000000"}
    out = node(name, "ERR")
    out["metadata"]["annotations"][KEYS.health] = json.dumps(
        {"verdict": "ERR", "since": "2026-01-01T00:00:00Z", "top": "REMAP_PENDING",
         "held": [held], "findings": [], "checks": {}})
    return out


def gpu_off_the_bus(name: str) -> Obj:
    """A node whose agent holds XID_79 on GPU 5: a reboot is due."""
    out = node(name, "EVICT", codes=("XID_79",))
    out["status"]["nodeInfo"] = {"bootID": "boot-1"}
    return out


def rebooted(api: ApiEmulator, name: str) -> None:
    """What the kubelet reports once the node came back from its reboot."""
    obj = api.get("Node", name)
    obj["status"]["nodeInfo"]["bootID"] = "boot-2"
    api.put(obj)


REBOOT = {"apiVersion": "remediation.medik8s.io/v1alpha1",
          "kind": "SelfNodeRemediationTemplate", "namespace": "medik8s", "name": "automatic"}
pytestmark = pytest.mark.anyio


async def test_the_controller_needs_every_rule_and_no_more(
        api: ApiEmulator, kube_for: KubeFactory) -> None:  # noqa: F811
    authz = RbacAuthorizer.from_manifests(plain_resources(BASE))
    api.authorizer = authz
    api.seed(node("n1"), node("n2"), appwrapper("a"), appwrapper("b"),
             gpu_pod("a", "n1"), gpu_pod("b", "n2"), default_flavor(), slack_queue(),
             agent_pod(0, "n1"), agent_pod(1, "n2"), node("n3"), node("n4"),
             template("automatic", "medik8s", {"remediationStrategy": "Automatic"}))
    # Someone else's write lands first, once on the AppWrapper and once on the queue.
    api.fail("PATCH", r"/apis/workload\.codeflare\.dev/.*/appwrappers/a/status", 409)
    api.fail("PATCH", r"/apis/kueue\.x-k8s\.io/.*/clusterqueues/.*", 409)
    async with controllers(kube_for, settings(repair={"enabled": True, "reboot": REBOOT}),
                           CONTROLLER) as (ctl,):
        await settled(ctl)
        await eventually(lambda: all(KEYS.peers in (api.get("Node", n) or {})["metadata"]
                                     .get("annotations", {}) for n in ("n1", "n2")))
        set_verdict(api, "n1", "EVICT", "XID_79")
        await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4",
                         within=10)
        await eventually(lambda: events(api, "NodeEvicted") and events(api, "AppWrapperReset"))
        set_verdict(api, "n1", "PASS")
        await eventually(lambda: gpu_limit(api) is None)
        api.put(remap_pending("n3"))
        async with anyio.create_task_group() as group:
            group.start_soon(agent_lets_go, api, "n3")  # n3's agent ends its NVML session
            await eventually(lambda: api.list("Job", "healthd-system-repair")
                             and events(api, "GPUReset"))
            group.cancel_scope.cancel()
        fail_job(api)  # as the Job controller does: the controller reads why from its pod
        await eventually(lambda: events(api, "RepairFailed"))
        api.put(gpu_off_the_bus("n4"))
        await eventually(lambda: api.list("SelfNodeRemediation", "medik8s")
                         and events(api, "RebootRequested"))
        rebooted(api, "n4")
        await eventually(lambda: events(api, "RebootDone")
                         and not api.list("SelfNodeRemediation", "medik8s"))
    assert [str(r) for r in authz.denied] == []
    assert authz.unused(CONTROLLER) == []
