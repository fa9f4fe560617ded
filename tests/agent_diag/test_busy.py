"""`gpu_pods`: which pods keep an exclusive diagnostic off the node, for every pod
shape (phases, terminating, CPU-only, GPUs only in limits, GPUs only in an init
container, other nodes, the agent's own diagnostic pods), over the real client."""

from __future__ import annotations

import pytest

from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.kube.errors import Unavailable
from healthd.kube.pods import gpu_pods
from healthd.sim.apiserver import ApiEmulator

from .conftest import NODE, container, node, pod

pytestmark = pytest.mark.anyio


async def test_every_pod_shape(api: ApiEmulator, kube: Kube) -> None:
    api.seed(
        node(),
        pod("running", containers=[container(requests=2, limits=2)]),
        pod("pending-bound", phase="Pending", containers=[container(requests=1, limits=1)]),
        pod("succeeded", phase="Succeeded", containers=[container(requests=8, limits=8)]),
        pod("failed", phase="Failed", containers=[container(requests=8, limits=8)]),
        pod("terminating", deleting=True, containers=[container(limits=1)]),
        pod("cpu-only", containers=[container()]),
        pod("zero-gpus", containers=[container(requests=0, limits=0)]),
        pod("limits-only", containers=[container(limits=4)]),
        pod("init-gpu", phase="Pending", containers=[container()],
            init=[container("setup", requests=1, limits=1)]),
        pod("second-container", containers=[container("a"), container("b", limits=1)]),
        pod("other-node", node_name="gpu-node-2", containers=[container(limits=8)]),
        pod("unbound", node_name="", phase="Pending", containers=[container(limits=8)]),
        pod("diag", namespace="healthd-system", labels={Keys().diagnostic: "true"},
            containers=[container(requests=8, limits=8)]),
    )
    assert await gpu_pods(kube, NODE, Keys()) == [
        "work/init-gpu", "work/limits-only", "work/pending-bound", "work/running",
        "work/second-container", "work/terminating",
    ]


async def test_idle_node_has_no_gpu_pods(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node(), pod("done", phase="Succeeded", containers=[container(limits=8)]),
             pod("web", containers=[container()]))
    assert await gpu_pods(kube, NODE, Keys()) == []


async def test_garbage_quantities_do_not_crash(api: ApiEmulator, kube: Kube) -> None:
    weird = container()
    weird["resources"] = {"limits": {"nvidia.com/gpu": "lots"}, "requests": "nonsense"}
    api.seed(pod("weird", containers=[weird]), pod("real", containers=[container(limits=1)]))
    assert await gpu_pods(kube, NODE, Keys()) == ["work/real"]


async def test_api_failure_is_raised_not_taken_for_idle(api: ApiEmulator, kube: Kube) -> None:
    # An unlistable node must never look idle: the diagnostic would evict nothing but
    # share GPUs with work the agent cannot see.
    api.fail("GET", "/api/v1/pods", 503)
    with pytest.raises(Unavailable):
        await gpu_pods(kube, NODE, Keys())
