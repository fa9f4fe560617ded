"""The agent's peers and its own interfaces, at O(1) cost (healthd.agent.peers):

- `PublishedPeers`: ping's peers are what the controller published on this Node;
  none (or an unreadable annotation) gives no peers and one log line saying why,
  not one per copy of the Node;
- `OwnPod`: the `nic` check's interfaces come from this node's own live agent pod,
  found by one list of this node's agent pods (field selector `spec.nodeName`), retried
  until it runs; never a watch, never the other nodes' pods; the newest pod of a
  rolling update wins.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import pytest

from checks.base import Attachment, Peer
from healthd.agent.peers import OwnPod, PublishedPeers
from healthd.blame.peersets import PeerSet
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator

from .conftest import NODE, pod

NS = "healthd-system"
SELECTOR = "app.kubernetes.io/name=healthd-agent"
AGENT = {"app.kubernetes.io/name": "healthd-agent"}
KEYS = Keys()
MULTUS = "k8s.v1.cni.cncf.io/network-status"


def agent_pod(name: str, node_name: str, ip: str, **kwargs: Any) -> dict[str, Any]:
    return pod(name, node_name=node_name, namespace=NS, labels=AGENT, ip=ip, **kwargs)


def with_net1(obj: dict[str, Any], ip: str) -> dict[str, Any]:
    obj["metadata"]["annotations"] = {MULTUS: json.dumps([
        {"name": "pod", "interface": "eth0", "ips": ["10.0.0.1"], "default": True},
        {"name": "healthd-system/net1", "interface": "net1", "ips": [ip]}])}
    return obj


def node_with(annotation: str | None) -> dict[str, Any]:
    annotations = {} if annotation is None else {KEYS.peers: annotation}
    return {"metadata": {"name": NODE, "annotations": annotations}}


def test_peers_are_what_the_node_carries(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[list[Peer]] = []
    peers = PublishedPeers(KEYS, seen.append)
    published = PeerSet(3, (Peer("n2", ("10.0.0.2",), {"net1": ("192.168.1.2",)}),
                            Peer("n3", (), {"net1": ("192.168.1.3",)})))
    with caplog.at_level(logging.WARNING, logger="healthd.agent.peers"):
        for _ in range(3):  # heartbeats: the same copy again
            peers.observe(node_with(None))
        peers.observe(node_with(published.encode()))
        peers.observe(node_with(published.encode()))
        peers.observe(node_with("{oops"))
        peers.observe(node_with("{oops"))
    assert seen == [[], list(published.peers), []]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "probes nobody until the healthd controller publishes" in said[0]
    assert "cannot be read" in said[1]


@pytest.mark.anyio
async def test_own_interfaces_from_one_list_of_this_nodes_agent_pods(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(agent_pod("old", NODE, "", phase="Pending"),
             with_net1(agent_pod("other", "n2", "10.0.0.2"), "192.168.1.2"))
    found: list[tuple[Attachment, ...]] = []
    own = OwnPod(kube, NODE, namespace=NS, label_selector=SELECTOR,
                 on_attachments=found.append)
    async with anyio.create_task_group() as group:
        group.start_soon(own.run)
        await anyio.sleep(0.3)
        assert found == []  # not running yet: it waits
        api.seed(with_net1(agent_pod("mine", NODE, "10.0.0.1",
                                     created="2026-11-26T00:00:00Z"), "192.168.1.1"))
        with anyio.fail_after(10):
            while not found:
                await anyio.sleep(0.02)
        group.cancel_scope.cancel()
    assert found == [(Attachment("net1", "net1", ("192.168.1.1",)),)]
    looks = api.requests_to("GET", f"/api/v1/namespaces/{NS}/pods")
    assert looks and all(r.query.get("fieldSelector") == f"spec.nodeName={NODE}"
                         and r.query.get("watch") != "true" for r in looks)


@pytest.mark.anyio
async def test_own_pod_by_name_and_no_polling_without_one(
        api: ApiEmulator, kube: Kube, caplog: pytest.LogCaptureFixture) -> None:
    """With POD_NAME the agent lists exactly its own pod; with no agent pod to find (an
    agent run outside a pod) it gives up after a few looks and says so: it never
    polls."""
    api.seed(with_net1(agent_pod("mine", NODE, "10.0.0.1"), "192.168.1.1"),
             with_net1(agent_pod("twin", NODE, "10.0.0.9", created="2026-11-27T00:00:00Z"),
                       "192.168.1.9"))
    found: list[tuple[Attachment, ...]] = []
    with anyio.fail_after(10):
        await OwnPod(kube, NODE, namespace=NS, label_selector=SELECTOR, pod_name="mine",
                     on_attachments=found.append).run()
    assert found == [(Attachment("net1", "net1", ("192.168.1.1",)),)]
    assert [r.query.get("fieldSelector") for r in api.requests_to(
        "GET", f"/api/v1/namespaces/{NS}/pods")] == ["metadata.name=mine"]

    api.clear_log()
    with caplog.at_level(logging.WARNING, logger="healthd.agent.peers"), anyio.fail_after(10):
        await OwnPod(kube, "elsewhere", namespace=NS, label_selector=SELECTOR,
                     on_attachments=found.append, max_looks=2).run()
    assert len(found) == 1
    assert len(api.requests_to("GET", f"/api/v1/namespaces/{NS}/pods")) == 2
    assert "no secondary interface" in caplog.records[-1].getMessage()
