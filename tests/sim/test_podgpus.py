"""The simulation's own GPU accounting agrees with the product's rule
(healthd.kube.pods) on every valid pod shape: two independent readings of the
same Kubernetes semantics, so a bug in either shows here."""

from __future__ import annotations

from typing import Any

import pytest

from healthd.kube.conventions import GPU_RESOURCE
from healthd.kube.pods import is_terminated, pod_gpus
from healthd.sim.podgpus import gpus_needed, keeps_gpus


def container(requests: int | None = None, limits: int | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = {GPU_RESOURCE: str(requests)}
    if limits is not None:
        resources["limits"] = {GPU_RESOURCE: limits}
    return {"name": "c", "resources": resources}


SHAPES = {
    "cpu only": {"containers": [container()]},
    "limits only": {"containers": [container(limits=4)]},
    "requests equal limits": {"containers": [container(2, 2), container(1, 1)]},
    "init container larger": {"initContainers": [container(limits=8)],
                              "containers": [container(limits=2)]},
    "init container smaller": {"initContainers": [container(limits=1)],
                               "containers": [container(limits=2), container(limits=3)]},
    "zero": {"containers": [container(0, 0)]},
}


@pytest.mark.parametrize("shape", SHAPES)
def test_same_count_as_the_product(shape: str) -> None:
    pod = {"spec": SHAPES[shape]}
    assert gpus_needed(pod) == pod_gpus(pod)


@pytest.mark.parametrize("phase", ["Pending", "Running", "Succeeded", "Failed", None])
def test_same_lifetime_as_the_product(phase: str | None) -> None:
    pod = {"status": {"phase": phase}} if phase else {}
    assert keeps_gpus(pod) is not is_terminated(pod)
