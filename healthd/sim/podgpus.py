"""How many GPUs a pod takes from its node, as the simulated scheduler, kubelet and
AppWrapper operator count them.

Written apart from the product's rule (healthd.kube.pods) on purpose: the simulation
exists to catch a bug in that rule, which it could not do by calling it.

Kubernetes accounts an extended resource by its request, which defaults to its
limit and must equal it when both are given. A pod needs the sum over its regular
containers, or its largest init container when that is more (init containers run
one at a time, before the others). It keeps them from binding until it has
terminated, whoever created it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from healthd.kube.conventions import GPU_RESOURCE

_DONE = ("Succeeded", "Failed")


def _asked(container: Any) -> int:
    resources = container.get("resources") if isinstance(container, Mapping) else None
    if not isinstance(resources, Mapping):
        return 0
    for part in ("requests", "limits"):  # a request defaults to the limit
        amounts = resources.get(part)
        if isinstance(amounts, Mapping) and GPU_RESOURCE in amounts:
            try:
                return max(0, int(str(amounts[GPU_RESOURCE])))
            except ValueError:
                return 0
    return 0


def gpus_needed(pod: Mapping[str, Any]) -> int:
    """The GPUs the scheduler reserves for `pod`."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return 0
    regular = sum(_asked(c) for c in spec.get("containers") or [])
    init = max((_asked(c) for c in spec.get("initContainers") or []), default=0)
    return max(regular, init)


def keeps_gpus(pod: Mapping[str, Any]) -> bool:
    """Whether `pod` still has its GPUs: it has not terminated."""
    status = pod.get("status")
    return not (isinstance(status, Mapping) and status.get("phase") in _DONE)
