"""Ping's peers on the real control plane: the controller, with its own Pod's token and
the admission policies in force, publishes each GPU node's peer set on its Node
(`healthd.io/peers`, the addresses of the kwok agent Pods); the agents, whose tokens may
not watch the agent Pods, read them from their own Node and ping them when asked (the
ping check runs: it is not SKIPPED for want of peers)."""

from __future__ import annotations

import json

from healthd.blame.peersets import decode
from tests.e2e.healthd import NAMESPACE, Healthd, eventually


def test_the_controller_publishes_peers_and_the_agents_ping_them(healthd: Healthd) -> None:
    nodes = healthd.start_fleet("peers", 3)
    agents = {p.spec.node_name: p for p in healthd.core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/name=healthd-agent").items
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None}

    def published(node: str) -> str | None:
        return (healthd.node(node)["metadata"].get("annotations") or {}).get("healthd.io/peers")
    for node in nodes:
        eventually(lambda n=node: published(n), 60, f"peers on {node}")  # type: ignore[misc]
    for node in nodes:
        peer_set = decode(published(node))
        assert node not in peer_set.probed()
        assert 2 <= len(peer_set.probed()) <= 16
        for peer in peer_set.peers:
            assert peer.name in agents
            assert list(peer.addresses) == [agents[peer.name].status.pod_ip]

    healthd.core.patch_node(nodes[0], {"metadata": {"annotations": {
        "healthd.io/run": "ping", "healthd.io/run-id": "peers-e2e"}}})

    def answer() -> dict[str, object] | None:
        raw = (healthd.node(nodes[0])["metadata"].get("annotations") or {}).get(
            "healthd.io/last-run")
        done = json.loads(raw) if raw else None
        return done if done and done.get("id") == "peers-e2e" and done.get("end") else None
    done = eventually(answer, 60, "the ping request answered")
    assert done["checks"]["ping"] != "SKIPPED", done  # type: ignore[index]
