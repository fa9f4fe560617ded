"""Whether the node's GPUs are in use: the gate in front of exclusive diagnostics.

A deep diagnostic (`dcgm:3`) needs every GPU of the node to itself, so it may start
only when no pod on the node holds one. "Holds" follows the scheduler's accounting:
a pod counts from the moment it is bound to the node until it has terminated
(phase Succeeded or Failed). A pod being deleted still counts: its containers keep
the GPUs until the kubelet has stopped them and the object is gone. The count takes
the larger of requests and limits over regular and init containers (an init
container holds its GPUs while it runs), so a pod that asks for a GPU anywhere
counts. The agent's own diagnostic pods never count: they are what will run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from healthd.kube.conventions import GPU_RESOURCE, Keys
from healthd.kube.objects import (
    PODS,
    amounts_of,
    containers_of,
    items_of,
    labels_of,
    meta,
    phase_of,
)
from healthd.kube.shapes import Container, Pod

if TYPE_CHECKING:
    from healthd.kube.client import Kube

TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})


def _quantity(value: object) -> int:
    """An extended-resource quantity (`"2"`, 2); anything unreadable is 0."""
    try:
        return max(0, int(str(value).strip()))
    except ValueError:
        return 0


def _container_gpus(container: Container) -> int:
    return max((_quantity(a) for a in amounts_of(container, GPU_RESOURCE)), default=0)


def pod_gpus(pod: Pod) -> int:
    """GPUs a pod holds while it is on the node, as the scheduler counts them: the
    larger of the sum over regular containers and the largest init container."""
    regular = sum(_container_gpus(c) for c in containers_of(pod))
    init = max((_container_gpus(c) for c in containers_of(pod, init=True)), default=0)
    return max(regular, init)


def is_terminated(pod: Pod) -> bool:
    return phase_of(pod) in TERMINATED_PHASES


def is_diagnostic(pod: Pod, keys: Keys) -> bool:
    """One of the agent's own diagnostic pods (label `<own prefix>diagnostic=true`)."""
    return labels_of(pod).get(keys.diagnostic) == "true"


def holds_gpus(pod: Pod, keys: Keys) -> bool:
    """A live (not terminated) workload pod that asks for at least one GPU."""
    return not is_terminated(pod) and not is_diagnostic(pod, keys) and pod_gpus(pod) > 0


def gpu_holders(pods: Iterable[Pod], keys: Keys) -> list[str]:
    """`namespace/name` of the pods among `pods` that hold GPUs, sorted."""
    out = []
    for pod in pods:
        if isinstance(pod, dict) and holds_gpus(pod, keys):
            m = meta(pod)
            out.append(f"{m.get('namespace', '')}/{m.get('name', '')}")
    return sorted(out)


async def gpu_pods(kube: Kube, node: str, keys: Keys) -> list[str]:
    """`namespace/name` of the non-terminated pods on `node` that hold GPUs.

    Raises `healthd.kube.errors.KubeError` when the pods cannot be listed: the caller
    must not start a diagnostic it cannot prove safe."""
    listed = await kube.list(PODS, field_selector=f"spec.nodeName={node}")
    return gpu_holders(items_of(listed, Pod), keys)
