"""The upstream lendingLimit sequence, step by step, against the emulator over HTTP.

Nominal 6 GPUs, two 4-GPU nodes: nil -> EVICT n1 -> 2 -> TESTING n2 -> 0 (clamped)
-> n1 PASS -> 2 -> n2 PASS -> nil (field removed); cordon n1 -> 2; nominal 6 -> 8
-> 4; delete healthy n2 -> still 4; delete cordoned n1 -> nil. Then the same rules
for NotReady/unreachable taints, and WARN, which never counts.
"""

from __future__ import annotations

import pytest

from healthd.kube.client import Kube
from healthd.sim.apiserver import ApiEmulator
from tests.controller_lending.helpers import (
    edit,
    flavor,
    lending,
    limit_of,
    node,
    queue_writes,
    set_verdict,
    settle,
    simple_queue,
    until,
)

pytestmark = pytest.mark.anyio


def seed_upstream(api: ApiEmulator) -> None:
    api.seed(node("n1"), node("n2"), flavor("default-flavor"), simple_queue("6"))


async def expect(api: ApiEmulator, value: str | None) -> None:
    await until(lambda: limit_of(api) == value)


async def test_upstream_sequence(api: ApiEmulator, kube: Kube) -> None:
    seed_upstream(api)
    async with lending(kube):
        await settle(api)
        assert limit_of(api) is None and queue_writes(api) == []  # healthy: nothing to write

        set_verdict(api, "n1", "EVICT")
        await expect(api, "2")
        set_verdict(api, "n2", "TESTING")
        await expect(api, "0")  # 8 unavailable, nominal 6: clamped at 0
        set_verdict(api, "n1", "PASS")
        await expect(api, "2")
        set_verdict(api, "n2", "PASS")
        await expect(api, None)
        entry = api.get("ClusterQueue", "slack-cluster-queue")["spec"]["resourceGroups"][0]
        assert "lendingLimit" not in entry["flavors"][0]["resources"][0]  # removed, not "6"

        edit(api, "Node", "n1", lambda n: n["spec"].update(unschedulable=True))
        await expect(api, "2")

        def raise_nominal(q: dict) -> None:
            q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "8"
        edit(api, "ClusterQueue", "slack-cluster-queue", raise_nominal)
        await expect(api, "4")

        api.remove("Node", "n2")  # healthy: deleting it changes nothing
        await settle(api)
        assert limit_of(api) == "4"
        api.remove("Node", "n1")  # cordoned: its capacity stops counting at once
        await expect(api, None)


@pytest.mark.parametrize("taint", ["node.kubernetes.io/not-ready",
                                   "node.kubernetes.io/unreachable"])
async def test_not_ready_and_unreachable_taints(api: ApiEmulator, kube: Kube,
                                                taint: str) -> None:
    seed_upstream(api)
    async with lending(kube):
        edit(api, "Node", "n1", lambda n: n["spec"].update(taints=[
            {"key": taint, "effect": "NoSchedule"}]))
        await expect(api, "2")
        edit(api, "Node", "n1", lambda n: n["spec"].update(taints=[]))
        await expect(api, None)


async def test_warn_never_counts(api: ApiEmulator, kube: Kube) -> None:
    seed_upstream(api)
    async with lending(kube):
        set_verdict(api, "n1", "WARN")
        set_verdict(api, "n2", "WARN")
        await settle(api)
        assert limit_of(api) is None
        assert queue_writes(api) == []


async def test_err_does_not_count_when_not_configured(api: ApiEmulator, kube: Kube) -> None:
    seed_upstream(api)
    async with lending(kube, unavailable_verdicts=["EVICT", "TESTING"]):
        set_verdict(api, "n1", "ERR")
        await settle(api)
        assert limit_of(api) is None
        set_verdict(api, "n2", "EVICT")
        await expect(api, "2")
