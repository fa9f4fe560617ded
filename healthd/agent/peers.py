"""The ping check's peers: the other nodes' agent pods, kept current by a watch.

Every GPU node runs an agent pod, so the agents' pod IPs are the natural set of
peers to probe (the same addresses the workloads' traffic uses), and their Multus
`network-status` names their addresses on every secondary network
(healthd.agent.network_status). `PeerWatcher` lists and watches the agent pods
once (`healthd.kube.watching.watch_forever`: resume, relist, backoff; no polling)
and keeps one `Peer` per other node: its running, not-terminating agent pod with
an IP. During a rolling update a node may briefly have two agent pods; the newest
one stands for the node. The agent's own pod gives the secondary interfaces the
`nic` check inspects (`attachments`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from checks.base import Attachment, Peer
from healthd.agent.network_status import ProblemLog, network_status
from healthd.kube.objects import PODS, is_deleting, key_of, meta, node_name_of, phase_of
from healthd.kube.shapes import Pod, entries, part, view
from healthd.kube.watching import watch_forever

if TYPE_CHECKING:
    from healthd.kube.client import Kube


def pod_addresses(pod: Pod) -> list[str]:
    """`status.podIPs[*].ip` (dual stack), else `status.podIP`."""
    status = part(pod.get("status"))
    ips = [str(entry["ip"]) for entry in entries(status.get("podIPs")) if entry.get("ip")]
    if not ips and status.get("podIP"):
        ips = [str(status["podIP"])]
    return ips


def is_live_peer(pod: Pod, own_node: str) -> bool:
    """Another node's agent pod that can answer: Running, not being deleted, has an IP."""
    node = node_name_of(pod)
    return (bool(node) and node != own_node
            and phase_of(pod) == "Running"
            and not is_deleting(pod)
            and bool(pod_addresses(pod)))


def _newest_per_node(pods: Mapping[str, Pod], own_node: str
                     ) -> dict[str, Pod]:
    newest: dict[str, Pod] = {}
    for pod in pods.values():
        if not is_live_peer(pod, own_node):
            continue
        node = node_name_of(pod)
        created = str(meta(pod).get("creationTimestamp") or "")
        held = newest.get(node)
        if held is None or created > str(meta(held).get("creationTimestamp") or ""):
            newest[node] = pod
    return newest


def peers_from(pods: Mapping[str, Pod], own_node: str) -> list[Peer]:
    """One Peer per other node, sorted by node name; the newest pod wins a node.
    Its secondary networks come from its network-status (none when unreadable)."""
    newest = _newest_per_node(pods, own_node)
    return [Peer(name=node, addresses=pod_addresses(newest[node]),
                 networks=network_status(newest[node]).addresses())
            for node in sorted(newest)]


def own_attachments(pods: Mapping[str, Pod], own_node: str
                    ) -> tuple[Attachment, ...]:
    """The secondary interfaces of this node's own (newest live) agent pod."""
    mine = {k: p for k, p in pods.items()
            if node_name_of(p) == own_node}
    newest = _newest_per_node(mine, "")
    pod = newest.get(own_node)
    return network_status(pod).attachments if pod is not None else ()


class PeerWatcher:
    """Keeps `peers` equal to the other nodes' live agent pods."""

    def __init__(self, kube: Kube, node: str, *, namespace: str, label_selector: str,
                 on_change: Callable[[list[Peer]], None] | None = None,
                 on_attachments: Callable[[tuple[Attachment, ...]], None] | None = None
                 ) -> None:
        self.kube = kube
        self.node = node
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_change = on_change  # called with the new list whenever it changes
        self.on_attachments = on_attachments  # this pod's secondary interfaces changed
        self._pods: dict[str, Pod] = {}
        self._peers: list[Peer] = []
        self._attachments: tuple[Attachment, ...] = ()
        self._problems = ProblemLog()

    @property
    def peers(self) -> list[Peer]:
        return list(self._peers)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Fold one watch event (ADDED, MODIFIED, DELETED) into the peer list."""
        pod = view(Pod, obj)
        key = key_of(pod)
        if kind == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = pod
            self._problems.note(key, network_status(pod))
        peers = peers_from(self._pods, self.node)
        if peers != self._peers:
            self._peers = peers
            if self.on_change is not None:
                self.on_change(self.peers)
        attachments = own_attachments(self._pods, self.node)
        if attachments != self._attachments:
            self._attachments = attachments
            if self.on_attachments is not None:
                self.on_attachments(attachments)

    async def run(self) -> None:
        """Watch until cancelled (watch_forever retries through API outages)."""
        async for event in watch_forever(self.kube, PODS, self.namespace,
                                         label_selector=self.label_selector):
            self.apply(event.type, event.object)
