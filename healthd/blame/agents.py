"""The agent pods as ping peers: which pod stands for a node, and its addresses.

Every GPU node runs an agent pod, so the agents' pod IPs are the natural addresses to
probe (the same ones the workloads' traffic uses), and their Multus `network-status`
names their addresses on every secondary network (healthd.blame.network_status). A
node's agent is its running, not-terminating agent pod with an IP; during a rolling
update a node may briefly have two, and the newest one stands for the node. The
controller reads them to publish peer sets (healthd.controller.peering); the agent
reads only its own, for the `nic` check's interfaces.
"""

from __future__ import annotations

from collections.abc import Iterable

from healthd.blame.network_status import network_status
from healthd.blame.peersets import Member
from healthd.kube.objects import is_deleting, meta, node_name_of, phase_of
from healthd.kube.shapes import Pod, entries, part


def pod_addresses(pod: Pod) -> list[str]:
    """`status.podIPs[*].ip` (dual stack), else `status.podIP`."""
    status = part(pod.get("status"))
    ips = [str(entry["ip"]) for entry in entries(status.get("podIPs")) if entry.get("ip")]
    if not ips and status.get("podIP"):
        ips = [str(status["podIP"])]
    return ips


def is_live(pod: Pod) -> bool:
    """An agent pod that can answer: on a node, Running, not being deleted, has an IP."""
    return (bool(node_name_of(pod)) and phase_of(pod) == "Running"
            and not is_deleting(pod) and bool(pod_addresses(pod)))


def newest_per_node(pods: Iterable[Pod]) -> dict[str, Pod]:
    """node -> its newest live agent pod."""
    newest: dict[str, Pod] = {}
    for pod in pods:
        if not is_live(pod):
            continue
        node = node_name_of(pod)
        created = str(meta(pod).get("creationTimestamp") or "")
        held = newest.get(node)
        if held is None or created > str(meta(held).get("creationTimestamp") or ""):
            newest[node] = pod
    return newest


def member_of(pod: Pod) -> Member:
    """The node as its peers probe it: its pod's addresses on every network (its
    secondary networks none when its network-status is unreadable)."""
    return Member(node_name_of(pod), tuple(pod_addresses(pod)),
                  network_status(pod).addresses())
