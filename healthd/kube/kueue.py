"""Which Kueue API the server serves: ClusterQueues and ResourceFlavors exist in
`v1beta2` (cohort field `cohortName`) and `v1beta1` (`cohort`); v1beta2 wins."""

from __future__ import annotations

from typing import NamedTuple

from healthd.kube.client import Kube
from healthd.kube.errors import NotFound
from healthd.kube.objects import (
    CLUSTERQUEUES_V1BETA1,
    CLUSTERQUEUES_V1BETA2,
    RESOURCEFLAVORS_V1BETA1,
    RESOURCEFLAVORS_V1BETA2,
    Resource,
)
from healthd.kube.shapes import APIGroup, ClusterQueue, entries, part, view

KUEUE_GROUP = "kueue.x-k8s.io"


class KueueResources(NamedTuple):
    """The ClusterQueue and ResourceFlavor collections of the Kueue version in use."""

    queues: Resource
    flavors: Resource

    @property
    def cohort_field(self) -> str:
        """`cohortName` in v1beta2, `cohort` in v1beta1."""
        return "cohort" if self.queues.version == "v1beta1" else "cohortName"


KUEUE_V1BETA2 = KueueResources(CLUSTERQUEUES_V1BETA2, RESOURCEFLAVORS_V1BETA2)
KUEUE_V1BETA1 = KueueResources(CLUSTERQUEUES_V1BETA1, RESOURCEFLAVORS_V1BETA1)


def cohort_of(queue: ClusterQueue) -> str:
    """The queue's cohort, under either version's field name; "" when it has none."""
    spec = part(queue.get("spec"))
    return str(spec.get("cohortName") or spec.get("cohort") or "")


def choose_kueue(group: APIGroup) -> KueueResources | None:
    """From an APIGroup document: v1beta2 when served, else v1beta1, else None."""
    versions = {str(v.get("version")) for v in entries(group.get("versions"))}
    if "v1beta2" in versions:
        return KUEUE_V1BETA2
    if "v1beta1" in versions:
        return KUEUE_V1BETA1
    return None


async def discover_kueue(kube: Kube) -> KueueResources | None:
    """The Kueue version the server serves; None when it serves no Kueue group
    (NotFound) or no version we know. Other failures raise `KubeError`."""
    try:
        return choose_kueue(view(APIGroup, await kube.request("GET", f"/apis/{KUEUE_GROUP}")))
    except NotFound:
        return None
