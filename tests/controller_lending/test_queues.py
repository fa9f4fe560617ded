"""Queue shapes and Kueue versions: flavors with different nodeLabels, several
resource groups, cpu and memory quantities, `pods` and uncovered resources left
alone, the allocatable capacity source, Kueue v1beta1 and v1beta2, and a queue that
only appears later."""

from __future__ import annotations

import pytest

from healthd.capacity.quantities import parse_quantity
from healthd.kube.client import Kube
from healthd.kube.kueue import KUEUE_V1BETA1
from healthd.sim.apiserver import ApiEmulator
from tests.controller_lending.helpers import (
    GPU,
    edit,
    flavor,
    group,
    lending,
    limit_of,
    node,
    queue,
    queue_writes,
    resources,
    set_verdict,
    settle,
    simple_queue,
    stored_queue,
    until,
)

pytestmark = pytest.mark.anyio


async def test_only_the_matching_flavor_shrinks(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", gpus=8, labels={"gpu": "h100"}),
             node("n2", gpus=8, labels={"gpu": "a100"}),
             flavor("a100", {"gpu": "a100"}), flavor("h100", {"gpu": "h100"}),
             queue(group(("a100", resources(gpu="16")), ("h100", resources(gpu="16")))))
    async with lending(kube):
        set_verdict(api, "n1", "EVICT")
        await until(lambda: limit_of(api, f=1) == "8")
        await settle(api)
        assert limit_of(api, f=0) is None  # a100 nodes are all fine


async def test_empty_node_labels_match_every_node(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", gpus=8, labels={"gpu": "h100"}), flavor("default-flavor"),
             flavor("h100", {"gpu": "h100"}),
             queue(group(("default-flavor", resources(gpu="12")), ("h100", resources(gpu="8")))))
    async with lending(kube):
        set_verdict(api, "n1", "ERR")
        await until(lambda: limit_of(api, f=0) == "4" and limit_of(api, f=1) == "0")


async def test_several_groups_and_quantities(api: ApiEmulator, kube: Kube) -> None:
    capacity = {GPU: "8", "cpu": "1500m", "memory": "512Gi", "pods": "110",
                "ephemeral-storage": "1Ti"}
    api.seed(node("n1", capacity=capacity), flavor("default-flavor"), queue(
        group(("default-flavor", resources(gpu="8"))),
        group(("default-flavor", resources(cpu="2", memory="2000G", pods="100")))))
    async with lending(kube):
        edit(api, "Node", "n1", lambda n: n["spec"].update(unschedulable=True))
        await until(lambda: limit_of(api, g=1, r=1) is not None)
        assert limit_of(api, g=0) == "0"
        assert limit_of(api, g=1, r=0) == "500m"
        written = limit_of(api, g=1, r=1)
        assert parse_quantity(written) == parse_quantity("2000G") - parse_quantity("512Gi")
        assert limit_of(api, g=1, r=2) is None  # pods are never counted
        # ephemeral-storage is unavailable but not covered: nothing to write anywhere
        assert "ephemeral-storage" not in str(stored_queue(api)["spec"])


async def test_allocatable_source(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", capacity={GPU: "8"}, allocatable={GPU: "6"}), flavor("default-flavor"),
             simple_queue("8"))
    async with lending(kube, capacity_source="allocatable"):
        set_verdict(api, "n1", "EVICT")
        await until(lambda: limit_of(api) == "2")


async def test_kueue_v1beta1_only(api: ApiEmulator, kube: Kube) -> None:
    api.serve("kueue.x-k8s.io/v1beta2", False)
    api.seed(node("n1"), flavor("default-flavor", version="v1beta1"),
             simple_queue("6", version="v1beta1"))
    async with lending(kube) as stack:
        assert stack.caches.kueue == KUEUE_V1BETA1
        set_verdict(api, "n1", "EVICT")
        await until(lambda: limit_of(api) == "2")
    paths = {w.path for w in queue_writes(api)}
    assert paths == {"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/slack-cluster-queue"}


async def test_kueue_v1beta2_preferred(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", verdict="EVICT"), flavor("default-flavor"), simple_queue("6"))
    async with lending(kube):
        await until(lambda: limit_of(api) == "2")
    paths = {w.path for w in queue_writes(api)}
    assert paths == {"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/slack-cluster-queue"}


async def test_queue_missing_then_created(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"), flavor("default-flavor"))
    async with lending(kube):
        set_verdict(api, "n1", "EVICT")
        await settle(api)
        assert queue_writes(api) == []
        api.seed(simple_queue("6"))
        await until(lambda: limit_of(api) == "2")


async def test_other_queues_are_never_touched(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", verdict="EVICT"), flavor("default-flavor"),
             simple_queue("6", name="team-a"), simple_queue("6", name="slack-b"))
    async with lending(kube, slack_queues=["slack-b"]):
        await until(lambda: limit_of(api, name="slack-b") == "2")
        await settle(api)
    assert limit_of(api, name="team-a") is None
    assert {w.path.rsplit("/", 1)[1] for w in queue_writes(api)} == {"slack-b"}
