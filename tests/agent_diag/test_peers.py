"""`PeerWatcher`: the ping check's peers are the other nodes' live agent pods, kept
current by one watch (no polling): additions, deletions, pods that are not running or
are terminating, dual-stack addresses, and two agent pods on one node."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from checks.base import Peer
from healthd.agent.peers import PeerWatcher
from healthd.kube.client import Kube
from healthd.kube.objects import PODS
from healthd.sim.apiserver import ApiEmulator

from .conftest import NODE, pod

pytestmark = pytest.mark.anyio

NS = "healthd-system"
SELECTOR = "app.kubernetes.io/name=healthd-agent"
AGENT = {"app.kubernetes.io/name": "healthd-agent"}


def agent_pod(name: str, node_name: str, ip: str, **kwargs: object) -> dict[str, object]:
    return pod(name, node_name=node_name, namespace=NS, labels=AGENT, ip=ip, **kwargs)


@asynccontextmanager
async def watching(kube: Kube) -> AsyncIterator[tuple[PeerWatcher, list[list[Peer]]]]:
    changes: list[list[Peer]] = []
    watcher = PeerWatcher(kube, NODE, namespace=NS, label_selector=SELECTOR,
                          on_change=changes.append)
    async with anyio.create_task_group() as group:
        group.start_soon(watcher.run)
        yield watcher, changes
        group.cancel_scope.cancel()


async def until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.02)


def names(watcher: PeerWatcher) -> list[str]:
    return [p.name for p in watcher.peers]


async def test_peers_follow_the_agent_pods(api: ApiEmulator, kube: Kube) -> None:
    api.seed(agent_pod("agent-self", NODE, "10.0.0.1"),
             agent_pod("agent-b", "node-b", "10.0.0.2"),
             agent_pod("agent-c", "node-c", "10.0.0.3"),
             pod("not-an-agent", node_name="node-d", namespace=NS, ip="10.0.0.4"))
    async with watching(kube) as (watcher, changes):
        await until(lambda: names(watcher) == ["node-b", "node-c"])
        assert watcher.peers[0] == Peer("node-b", ["10.0.0.2"])

        await kube.delete(PODS, "agent-c", NS)
        await until(lambda: names(watcher) == ["node-b"])

        api.seed(agent_pod("agent-e", "node-e", "10.0.0.5"))
        await until(lambda: names(watcher) == ["node-b", "node-e"])
    assert changes[-1] == watcher.peers
    # One watch, resumed: the pods were listed once, never polled.
    gets = api.requests_to("GET", f"/api/v1/namespaces/{NS}/pods")
    assert len([r for r in gets if r.query.get("watch") != "true"]) == 1


async def test_only_live_pods_count(api: ApiEmulator, kube: Kube) -> None:
    dual = agent_pod("agent-dual", "node-dual", "10.0.0.9")
    dual["status"]["podIPs"] = [{"ip": "10.0.0.9"}, {"ip": "fd00::9"}]
    api.seed(
        dual,
        agent_pod("agent-pending", "node-p", "", phase="Pending"),
        agent_pod("agent-leaving", "node-l", "10.0.0.7", deleting=True),
        agent_pod("agent-no-ip", "node-n", ""),
        agent_pod("agent-old", "node-r", "10.0.1.1", created="2025-01-01T00:00:00Z"),
        agent_pod("agent-new", "node-r", "10.0.1.2", created="2025-01-02T00:00:00Z"),
    )
    async with watching(kube) as (watcher, _):
        await until(lambda: names(watcher) == ["node-dual", "node-r"])
        assert watcher.peers == [Peer("node-dual", ["10.0.0.9", "fd00::9"]),
                                 Peer("node-r", ["10.0.1.2"])]
        # The pending pod starts running: it becomes a peer without any polling.
        started = agent_pod("agent-pending", "node-p", "10.0.0.8")
        api.put(started)
        await until(lambda: "node-p" in names(watcher))
