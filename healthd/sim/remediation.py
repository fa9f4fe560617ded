"""A stand-in for the cluster's reboot operator (medik8s Self Node Remediation), and
the minimal CRDs of its request and template kinds, for tests and the demo.

healthd never reboots a node: it creates a request (a `SelfNodeRemediation` named
after the node) and waits for the node's boot id to change. This plays the other
side, through the Kubernetes API only, so it works against the API emulator and a
real kube-apiserver alike: it watches the request kind and, once per request,

1. reboots the node's simulated machine (`reboot(node)`: with `by_control_file`, the
   control-file op `reboot`; the GPUs keep only what survives a reboot,
   healthd.sim.repairs), as the operator's agent on the node does;
2. `boot_s` later, sets the Node's `status.nodeInfo.bootID` to a new id through the
   status subresource, as the kubelet does when it starts after the reboot. A real
   node reports its new boot only once it is up again; so does this one: every
   process simulating the machine follows its control file, and has rebooted it
   within `APPLIED_S`, before the new boot id shows (else an agent could still see the old
   GPUs after the boot id changed, which no real node shows).

A request it does not know the machine of (a node it was not given) is left alone,
as would be a node whose operator agent is not running; its node never reboots.
Deleting the request ends the remediation (the real operator then lets the node run
work again); this one has nothing to undo.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from healthd.kube.client import Kube
from healthd.kube.errors import KubeError
from healthd.kube.objects import NODES, Resource, meta, name_of
from healthd.kube.watching import DELETED, watch_forever
from healthd.sim.control import APPLIED_S

log = logging.getLogger(__name__)
Obj = dict[str, Any]
GROUP, VERSION = "remediation.medik8s.io", "v1alpha1"
REQUESTS = Resource(GROUP, VERSION, "selfnoderemediations", True, "SelfNodeRemediation")
TEMPLATES = Resource(GROUP, VERSION, "selfnoderemediationtemplates", True,
                     "SelfNodeRemediationTemplate")
# Reboots the named node's simulated machine; False when it knows no such machine.
Reboot = Callable[[str], bool]
BOOT_S = APPLIED_S  # from the reboot to the new boot id (module docstring)


def by_control_file(machines: Mapping[str, Path]) -> Reboot:
    """Reboots through each machine's control file (node name -> file), which every
    process simulating that machine follows (healthd.sim.control)."""
    known = dict(machines)

    def reboot(node: str) -> bool:
        control = known.get(node)
        if control is None:
            return False
        with control.open("a") as handle:
            handle.write(json.dumps({"op": "reboot"}) + "\n")
        return True

    return reboot


def crd(res: Resource) -> Obj:
    """A minimal CustomResourceDefinition serving `res` (any spec and status kept)."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{res.plural}.{res.group}"},
        "spec": {"group": res.group, "scope": "Namespaced" if res.namespaced else "Cluster",
                 "names": {"plural": res.plural, "singular": res.kind.lower(),
                           "kind": res.kind, "listKind": f"{res.kind}List"},
                 "versions": [{"name": res.version, "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": schema},
                               "subresources": {"status": {}}}]}}


def crds() -> list[Obj]:
    """The request and template kinds' CRDs, for a real API server."""
    return [crd(REQUESTS), crd(TEMPLATES)]


def template(name: str, namespace: str, spec: Obj | None = None) -> Obj:
    """A remediation template whose requests get `spec`."""
    return {"apiVersion": TEMPLATES.api_version, "kind": TEMPLATES.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": dict(spec or {})}}}


class FakeRebootOperator:
    """Reboots the simulated machine of each node a request names (module docstring)."""

    def __init__(self, kube: Kube, reboot: Reboot, *, requests: Resource = REQUESTS,
                 namespace: str | None = None, boot_s: float = BOOT_S) -> None:
        self._kube, self._reboot, self._boot_s = kube, reboot, boot_s
        self._requests, self._namespace = requests, namespace
        self._done: set[str] = set()  # request uids acted on
        self.rebooted: list[str] = []  # node names, in the order they were rebooted

    async def run(self) -> None:
        """Follow the requests until cancelled."""
        async for event in watch_forever(self._kube, self._requests, self._namespace):
            if event.type != DELETED:
                await self._remediate(event.object)

    async def _remediate(self, request: Obj) -> None:
        uid, node = str(meta(request).get("uid", "")), name_of(request)
        if uid in self._done or not self._reboot(node):
            return
        self._done.add(uid)
        await anyio.sleep(self._boot_s)  # the machine comes up again
        boot_id = str(uuid.uuid4())
        try:
            await self._kube.merge_patch(NODES, node, {"status": {"nodeInfo": {
                "bootID": boot_id}}}, subresource="status")
        except KubeError as exc:  # rebooted, but the node's report did not get through
            log.warning("fake reboot operator: node %s: %s", node, exc)
            return
        self.rebooted.append(node)
        log.info("fake reboot operator: rebooted node %s (boot id %s)", node, boot_id)
