"""Typed views of the Kubernetes objects healthd reads: exactly the fields it reads.

Each view is a `TypedDict` with `total=False` (the API may leave any field out), so
mypy knows what a field holds and the code reads a Node, a Pod or a ClusterQueue by
its documented fields instead of by guessing. Fields healthd never reads are not
listed; the objects still carry them (a view is the same dict, not a copy).

A view is a promise about shape, not a check: someone with write access can still
put odd values where the API's own validation does not look. So JSON enters a view
through one door, `view` (a list response through `items_of` in
healthd.kube.objects), and a reader goes down into a sub-object or a list with
`part` and `entries`, which give an empty object or list for anything malformed,
never an exception. The accessors in healthd.kube.objects are built on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast

T = TypeVar("T", bound=Mapping[str, Any])


# The views exist for the type checker: at run time an object is the dict the API sent,
# and building some thirty TypedDict classes would cost every agent about 160 KB.
if TYPE_CHECKING:
    # -- every object (meta/v1) ------------------------------------------------------------

    class ObjectMeta(TypedDict, total=False):
        """`metadata` (meta/v1 ObjectMeta): the fields healthd reads of any object."""

        name: str
        namespace: str
        uid: str
        resourceVersion: str
        generation: int
        creationTimestamp: str
        deletionTimestamp: str  # set while the object is being deleted
        labels: dict[str, str]
        annotations: dict[str, str]
        managedFields: list[dict[str, Any]]  # never read: the caches drop it (slim)


    class KubeObject(TypedDict, total=False):
        """Any object: what every view below has in common."""

        apiVersion: str
        kind: str
        metadata: ObjectMeta


    class Condition(TypedDict, total=False):
        """One entry of `status.conditions` (the meta/v1 Condition shape; a Node's and a
        Pod's conditions have the same fields healthd reads)."""

        type: str
        status: str  # "True", "False", "Unknown"
        reason: str
        message: str
        lastTransitionTime: str
        lastHeartbeatTime: str  # Node conditions only
        observedGeneration: int


    # -- Node (core/v1) --------------------------------------------------------------------

    class Taint(TypedDict, total=False):
        key: str
        value: str
        effect: str


    class NodeSpec(TypedDict, total=False):
        unschedulable: bool  # cordoned
        taints: list[Taint]


    class NodeSystemInfo(TypedDict, total=False):
        bootID: str  # the kubelet's report of the machine's boot: new after each reboot


    class NodeStatus(TypedDict, total=False):
        capacity: dict[str, str]  # resource -> quantity, e.g. {"nvidia.com/gpu": "8"}
        allocatable: dict[str, str]
        conditions: list[Condition]
        nodeInfo: NodeSystemInfo


    class Node(KubeObject, total=False):
        """A core/v1 Node."""

        spec: NodeSpec
        status: NodeStatus


    # -- Pod (core/v1) ---------------------------------------------------------------------

    class ResourceRequirements(TypedDict, total=False):
        requests: dict[str, str]  # resource -> quantity ("1", "500m")
        limits: dict[str, str]


    class Container(TypedDict, total=False):
        name: str
        resources: ResourceRequirements


    class PodSpec(TypedDict, total=False):
        nodeName: str  # set once the pod is bound to a node
        nodeSelector: dict[str, str]  # a DaemonSet's pods carry its template's
        containers: list[Container]
        initContainers: list[Container]


    class ContainerStateTerminated(TypedDict, total=False):
        reason: str
        message: str
        exitCode: int
        finishedAt: str


    class ContainerState(TypedDict, total=False):
        terminated: ContainerStateTerminated


    class ContainerStatus(TypedDict, total=False):
        name: str
        restartCount: int
        state: ContainerState
        lastState: ContainerState  # the previous run, after a restart


    class PodIP(TypedDict, total=False):
        ip: str


    class PodStatus(TypedDict, total=False):
        phase: str  # Pending, Running, Succeeded, Failed, Unknown
        reason: str
        message: str
        conditions: list[Condition]
        containerStatuses: list[ContainerStatus]
        podIP: str
        podIPs: list[PodIP]


    class Pod(KubeObject, total=False):
        """A core/v1 Pod."""

        spec: PodSpec
        status: PodStatus


    # -- AppWrapper (workload.codeflare.dev/v1beta2) ---------------------------------------

    class AppWrapperSpec(TypedDict, total=False):
        managedBy: str  # absent, or the controller that manages it (MultiKueue, ...)


    class AppWrapperStatus(TypedDict, total=False):
        phase: str  # Running, Resetting, ...
        conditions: list[Condition]


    class AppWrapper(KubeObject, total=False):
        """A workload.codeflare.dev/v1beta2 AppWrapper. Its pods carry the label
        `workload.codeflare.dev/appwrapper` (its name), which is how healthd finds them."""

        spec: AppWrapperSpec
        status: AppWrapperStatus


    # -- Kueue (kueue.x-k8s.io/v1beta2, same fields in v1beta1) ------------------------------

    class ResourceQuota(TypedDict, total=False):
        name: str  # the resource, e.g. nvidia.com/gpu
        nominalQuota: str
        lendingLimit: str


    class FlavorQuotas(TypedDict, total=False):
        name: str  # a ResourceFlavor's name
        resources: list[ResourceQuota]


    class ResourceGroup(TypedDict, total=False):
        flavors: list[FlavorQuotas]


    class ClusterQueueSpec(TypedDict, total=False):
        cohortName: str  # v1beta2
        cohort: str  # v1beta1
        resourceGroups: list[ResourceGroup]


    class ClusterQueue(KubeObject, total=False):
        """A kueue.x-k8s.io ClusterQueue (v1beta2 or v1beta1)."""

        spec: ClusterQueueSpec


    class ResourceFlavorSpec(TypedDict, total=False):
        nodeLabels: dict[str, str]  # the nodes this flavor stands for


    class ResourceFlavor(KubeObject, total=False):
        """A kueue.x-k8s.io ResourceFlavor (v1beta2 or v1beta1)."""

        spec: ResourceFlavorSpec


    class GroupVersion(TypedDict, total=False):
        groupVersion: str
        version: str


    class APIGroup(TypedDict, total=False):
        """The meta/v1 APIGroup document at `/apis/<group>` (which versions are served)."""

        name: str
        versions: list[GroupVersion]


    # -- PersistentVolumeClaim (core/v1) -----------------------------------------------------

    class PersistentVolumeClaimStatus(TypedDict, total=False):
        phase: str  # Pending, Bound, Lost


    class PersistentVolumeClaim(KubeObject, total=False):
        """A core/v1 PersistentVolumeClaim (the pvc check's test claim)."""

        status: PersistentVolumeClaimStatus


    # -- Lease (coordination.k8s.io/v1) and Event (core/v1) --------------------------------

    class LeaseSpec(TypedDict, total=False):
        holderIdentity: str
        acquireTime: str
        renewTime: str
        leaseDurationSeconds: int
        leaseTransitions: int


    class Lease(KubeObject, total=False):
        """A coordination.k8s.io/v1 Lease."""

        spec: LeaseSpec


    class ObjectReference(TypedDict, total=False):
        apiVersion: str
        kind: str
        name: str
        namespace: str
        uid: str


    class Event(KubeObject, total=False):
        """A core/v1 Event."""

        type: str
        reason: str
        message: str
        involvedObject: ObjectReference
        firstTimestamp: str
        lastTimestamp: str
        eventTime: str


    # -- the door and the way down ---------------------------------------------------------
else:  # every view is a plain dict at run time
    ObjectMeta = dict
    KubeObject = dict
    Condition = dict
    Taint = dict
    NodeSpec = dict
    NodeStatus = dict
    Node = dict
    ResourceRequirements = dict
    Container = dict
    PodSpec = dict
    ContainerStateTerminated = dict
    ContainerState = dict
    ContainerStatus = dict
    PodIP = dict
    PodStatus = dict
    Pod = dict
    AppWrapperSpec = dict
    AppWrapperStatus = dict
    AppWrapper = dict
    ResourceQuota = dict
    FlavorQuotas = dict
    ResourceGroup = dict
    ClusterQueueSpec = dict
    ClusterQueue = dict
    ResourceFlavorSpec = dict
    ResourceFlavor = dict
    GroupVersion = dict
    APIGroup = dict
    PersistentVolumeClaimStatus = dict
    PersistentVolumeClaim = dict
    LeaseSpec = dict
    Lease = dict
    ObjectReference = dict
    Event = dict


def view(shape: type[T], obj: object) -> T:
    """`obj` seen as `shape` (e.g. `view(Node, event.object)`): the same dict, not a
    copy; {} when `obj` is not a JSON object at all. Where JSON from the API enters."""
    return cast(T, obj if isinstance(obj, dict) else {})


def part(value: T | None) -> T:
    """A sub-object as read (`part(node.get("spec"))`), or an empty one when it is
    absent or not a JSON object."""
    return value if isinstance(value, dict) else cast(T, {})


def entries(value: list[T] | None) -> list[T]:
    """The JSON objects of a list field as read (`entries(spec.get("taints"))`);
    [] when absent or not a list, and anything in it that is not an object skipped."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
