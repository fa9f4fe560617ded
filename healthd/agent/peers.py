"""The ping check's peers, and this node's own secondary interfaces, at O(1) cost.

No agent lists or watches the other agents (DESIGN.md, Scale: that is O(N) per agent
and O(N^2) per fleet). The controller, which watches the agent pods once, publishes
each node's bounded peer set on its own Node, annotation `healthd.io/peers`
(healthd.blame.peersets, healthd.controller.peering); the agent already watches its
own Node, and `PublishedPeers` turns each copy into the peers ping probes. A Node
without the annotation (the controller not running, or not upgraded) gives no peers:
ping then says SKIPPED ("no peers to ping"), never a result it did not measure.

The `nic` check's interfaces come from this node's own agent pod's Multus
`network-status`: `OwnPod` lists its own pod (field selector `metadata.name` with
POD_NAME, else the agent pods on this node, `spec.nodeName`) once at start, again with
backoff while it is not running yet, and gives up after `max_looks` (an agent run
outside a pod has none to find: it never polls). Multus writes the annotation when
the pod's network is set up, before the agent starts, and it does not change for the
pod's life.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from checks.base import Attachment, Peer
from healthd.blame.agents import newest_per_node
from healthd.blame.network_status import network_status
from healthd.blame.peersets import BadPeerSet, decode
from healthd.kube import Backoff, KubeError
from healthd.kube.conventions import Keys
from healthd.kube.objects import PODS, items_of
from healthd.kube.shapes import Pod

if TYPE_CHECKING:
    from healthd.kube.client import Kube

log = logging.getLogger(__name__)
_UNSEEN = object()  # no copy of the Node seen yet
MAX_LOOKS = 8  # about two minutes with the backoff: a pod runs well before that


class PublishedPeers:
    """The peers on this node's Node (`observe` each copy); says once per distinct
    problem why there are none."""

    def __init__(self, keys: Keys, on_change: Callable[[list[Peer]], None]) -> None:
        self._keys = keys
        self._on_change = on_change
        self._raw: object = _UNSEEN
        self._told = ""

    def observe(self, node: Mapping[str, Any]) -> None:
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(self._keys.peers)
        if self._raw is not _UNSEEN and raw == self._raw:
            return
        self._raw = raw
        peers, problem = self._read(raw)
        self._say(problem)
        self._on_change(peers)

    def _read(self, raw: object) -> tuple[list[Peer], str]:
        if raw is None:
            return [], (f"no {self._keys.peers} annotation on this node yet: ping probes "
                        "nobody until the healthd controller publishes its peers")
        try:
            return list(decode(raw).peers), ""
        except BadPeerSet as exc:
            return [], f"the {self._keys.peers} annotation cannot be read ({exc}): ping " \
                       "probes nobody until the controller rewrites it"

    def _say(self, problem: str) -> None:
        if problem and problem != self._told:
            log.warning("%s", problem)
        elif not problem and self._told:
            log.info("peers published on this node: ping probes them")
        self._told = problem


class OwnPod:
    """Finds this node's own agent pod once and hands its secondary interfaces over."""

    def __init__(self, kube: Kube, node: str, *, namespace: str, label_selector: str,
                 on_attachments: Callable[[tuple[Attachment, ...]], None],
                 pod_name: str = "", max_looks: int = MAX_LOOKS) -> None:
        self.kube = kube
        self.node = node
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_attachments = on_attachments
        self.pod_name = pod_name
        self.max_looks = max_looks

    async def run(self) -> None:
        """Look for this node's live agent pod (with backoff) until found or
        `max_looks` looks, then return."""
        backoff = Backoff(initial=1, maximum=60)
        which = (f"metadata.name={self.pod_name}" if self.pod_name
                 else f"spec.nodeName={self.node}")
        why = ""
        for look in range(self.max_looks):
            if look:
                await anyio.sleep(backoff.next())
            try:
                listing = await self.kube.list(PODS, self.namespace,
                                               label_selector=self.label_selector,
                                               field_selector=which)
                pod = newest_per_node(items_of(listing, Pod)).get(self.node)
                if pod is not None:
                    self.on_attachments(own_attachments(pod))
                    return
                why = f"no running agent pod ({which}) in {self.namespace}"
            except KubeError as exc:
                why = f"cannot list this node's agent pod ({exc})"
            log.debug("%s; looking again", why)
        log.warning("%s after %d looks: the nic check sees no secondary interface (an "
                    "agent outside a pod has none)", why, self.max_looks)


def own_attachments(pod: Pod) -> tuple[Attachment, ...]:
    """The secondary interfaces of this node's agent pod (none when unreadable)."""
    status = network_status(pod)
    if status.problem:
        log.warning("this agent pod's network-status annotation cannot be read: %s; the "
                    "nic check sees no secondary interface", status.problem)
    return status.attachments
