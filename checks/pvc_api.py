"""What the `pvc` probe needs from the cluster, as a protocol: `checks` never imports
`healthd` nor the Kubernetes client, so healthd implements it over its own
Kubernetes layer (healthd.kube.pvc_probe) and hands a factory to the check through
`CheckContext.pvc_api`.

The implementation owns the probe objects' labels (the keys are healthd's) and
translates every failure into one `ApiProblem` whose text is a one-line reason fit
for an UNKNOWN result: `"<what was being done>: <why it failed>"`. A 404 on delete
is success (the object is already gone); a missing storage class is `None`, so the
check can tell "not found" from "cannot ask".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class ApiProblem(Exception):
    """A Kubernetes call failed; `str(exc)` is a one-line reason."""


@dataclass(frozen=True)
class StorageClassInfo:
    """What the probe needs to know about a storage class."""

    name: str
    wait_for_first_consumer: bool
    reclaim_policy: str


class ProbeApi(Protocol):
    """The probe's view of the cluster: one namespace, the test objects of one node.
    Every method raises `ApiProblem` when the API fails."""

    async def storage_class(self, name: str) -> StorageClassInfo | None:
        """The storage class, or None when it does not exist."""
        ...

    async def create_pvc(self, manifest: Mapping[str, Any], storage_class: str
                         ) -> tuple[str, str]:
        """Create the PVC, labelled as this node's probe; return its resourceVersion
        (where a watch starts) and uid."""
        ...

    async def create_pod(self, manifest: Mapping[str, Any], storage_class: str) -> None:
        """Create the consumer pod, labelled as this node's probe."""
        ...

    async def wait_bound(self, name: str, resource_version: str) -> None:
        """Return once the PVC is Bound, watching it (never polling); the caller sets
        the deadline."""
        ...

    async def provisioning_failure(self, name: str, uid: str = "") -> str | None:
        """The message of the newest ProvisioningFailed event about the PVC, if any."""
        ...

    async def delete_probe(self, name: str, *, pod: bool) -> None:
        """Delete the consumer pod (first: it holds the PVC) and the PVC; a missing
        object is fine. Both are attempted even when one fails."""
        ...

    async def sweep(self) -> int:
        """Delete every probe pod and PVC of this node (leftovers of earlier runs);
        return how many there were."""
        ...


ProbeApiFactory = Callable[[str, str], ProbeApi]
"""(namespace, node) -> the probe's API for that node's test objects there."""
