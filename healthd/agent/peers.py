"""The ping check's peers: the other nodes' agent pods, kept current by a watch.

Every GPU node runs an agent pod, so the agents' pod IPs are the natural set of
peers to probe (the same addresses the workloads' traffic uses). `PeerWatcher`
lists and watches the agent pods once (`healthd.kube.watching.watch_forever`:
resume, relist, backoff; no polling) and keeps one `Peer` per other node: its
running, not-terminating agent pod with an IP. During a rolling update a node may
briefly have two agent pods; the newest one stands for the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from checks.base import Peer
from healthd.kube.objects import PODS, key_of, meta, node_name_of, phase_of
from healthd.kube.watching import watch_forever

if TYPE_CHECKING:
    from healthd.kube.client import Kube


def pod_addresses(pod: Mapping[str, Any]) -> list[str]:
    """`status.podIPs[*].ip` (dual stack), else `status.podIP`."""
    status = pod.get("status") or {}
    ips = [str(entry["ip"]) for entry in status.get("podIPs") or []
           if isinstance(entry, dict) and entry.get("ip")]
    if not ips and status.get("podIP"):
        ips = [str(status["podIP"])]
    return ips


def is_live_peer(pod: Mapping[str, Any], own_node: str) -> bool:
    """Another node's agent pod that can answer: Running, not being deleted, has an IP."""
    node = node_name_of(pod)
    return (bool(node) and node != own_node
            and phase_of(pod) == "Running"
            and not meta(pod).get("deletionTimestamp")
            and bool(pod_addresses(pod)))


def peers_from(pods: Mapping[str, Mapping[str, Any]], own_node: str) -> list[Peer]:
    """One Peer per other node, sorted by node name; the newest pod wins a node."""
    newest: dict[str, Mapping[str, Any]] = {}
    for pod in pods.values():
        if not is_live_peer(pod, own_node):
            continue
        node = node_name_of(pod)
        created = str(meta(pod).get("creationTimestamp") or "")
        held = newest.get(node)
        if held is None or created > str(meta(held).get("creationTimestamp") or ""):
            newest[node] = pod
    return [Peer(name=node, addresses=pod_addresses(newest[node])) for node in sorted(newest)]


class PeerWatcher:
    """Keeps `peers` equal to the other nodes' live agent pods."""

    def __init__(self, kube: Kube, node: str, *, namespace: str, label_selector: str,
                 on_change: Callable[[list[Peer]], None] | None = None) -> None:
        self.kube = kube
        self.node = node
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_change = on_change  # called with the new list whenever it changes
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._peers: list[Peer] = []

    @property
    def peers(self) -> list[Peer]:
        return list(self._peers)

    def apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        """Fold one watch event (ADDED, MODIFIED, DELETED) into the peer list."""
        key = key_of(dict(pod))
        if kind == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = pod
        peers = peers_from(self._pods, self.node)
        if peers != self._peers:
            self._peers = peers
            if self.on_change is not None:
                self.on_change(self.peers)

    async def run(self) -> None:
        """Watch until cancelled (watch_forever retries through API outages)."""
        async for event in watch_forever(self.kube, PODS, self.namespace,
                                         label_selector=self.label_selector):
            self.apply(event.type, event.object)
