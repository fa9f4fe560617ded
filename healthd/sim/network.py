"""Simulated networks for the demo: every node's agent pod on the pod network and on
one secondary network (`net1`, as Multus would attach it), links that an action
takes down, the ping check's echoes and the `nic` check's link reads answered from
that state.

`SimNetwork` is shared by the whole simulated fleet; `prober(node)` and
`links(node)` are the two seams the checks already have (`checks.ping.Prober`,
`checks.nic.LinkReader`), bound to the node whose agent uses them. `agent_pod`
gives the agent pod the API holds for a node, with `status.podIPs` and the Multus
`network-status` annotation the real agent reads its peers' networks from. A node's
link on a network is up or down; a peer answers on a network only when both ends'
links there are up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from checks.base import POD_NETWORK
from checks.probes import Echo, LinkState
from healthd.kube.conventions import NETWORK_STATUS_ANNOTATIONS

SECONDARY = "net1"
INTERFACE = {POD_NETWORK: "eth0", SECONDARY: "net1"}
MTU = {POD_NETWORK: 1450, SECONDARY: 9000}
SPEED_MBPS = 400_000  # a 400G RoCE NIC
RTT_MS = 0.05
AGENT_LABELS = {"app.kubernetes.io/name": "healthd-agent"}


@dataclass
class SimNetwork:
    """The fleet's links: addresses per (node, network) and which links are down."""

    nodes: Sequence[str]
    namespace: str = "healthd-system"
    down: set[tuple[str, str]] = field(default_factory=set)
    carrier_changes: dict[tuple[str, str], int] = field(default_factory=dict)
    _owners: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)

    def address(self, node: str, network: str) -> str:
        index = list(self.nodes).index(node) + 1
        return f"10.244.{index}.2" if network == POD_NETWORK else f"192.168.100.{index}"

    def owner(self, address: str) -> tuple[str, str] | None:
        """The (node, network) an address belongs to; None for a stranger."""
        if not self._owners:
            self._owners = {self.address(node, network): (node, network)
                            for node in self.nodes for network in INTERFACE}
        return self._owners.get(address)

    def set_link(self, node: str, network: str, up: bool) -> None:
        """Take `node`'s link on `network` down or bring it back (a carrier change)."""
        key = (node, network)
        if up == (key not in self.down):
            return
        self.carrier_changes[key] = self.carrier_changes.get(key, 0) + 1
        if up:
            self.down.discard(key)
        else:
            self.down.add(key)

    def agent_pod(self, node: str) -> dict[str, Any]:
        """The agent pod on `node`, as the kubelet and Multus leave it."""
        status = [{"name": "k8s-pod-network", "interface": "eth0", "default": True,
                   "ips": [self.address(node, POD_NETWORK)]},
                  {"name": f"{self.namespace}/{SECONDARY}", "interface": INTERFACE[SECONDARY],
                   "ips": [self.address(node, SECONDARY)]}]
        ip = self.address(node, POD_NETWORK)
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"healthd-agent-{node}", "namespace": self.namespace,
                             "labels": dict(AGENT_LABELS),
                             "annotations": {NETWORK_STATUS_ANNOTATIONS[0]: json.dumps(status)},
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": node, "containers": [{"name": "agent",
                                                           "image": "healthd"}]},
                "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}

    def prober(self, node: str) -> SimProber:
        return SimProber(self, node)

    def links(self, node: str) -> SimLinks:
        return SimLinks(self, node)


@dataclass(frozen=True)
class SimProber:
    """`checks.ping.Prober` for one node: an echo comes back when both ends' links on
    the address's network are up."""

    network: SimNetwork
    node: str

    async def probe(self, address: str, *, count: int, interval_s: float,
                    timeout_s: float) -> Echo:
        owner = self.network.owner(address)
        if owner is None:
            return Echo(address, count)
        net = owner[1]
        up = (self.node, net) not in self.network.down and owner not in self.network.down
        return Echo(address, count, (RTT_MS,) * count if up else ())


@dataclass(frozen=True)
class SimLinks:
    """`checks.nic.LinkReader` for one node's own interfaces."""

    network: SimNetwork
    node: str

    async def read(self, interfaces: Sequence[str]) -> Mapping[str, LinkState]:
        out: dict[str, LinkState] = {}
        for net, name in INTERFACE.items():
            if name not in interfaces:
                continue
            up = (self.node, net) not in self.network.down
            out[name] = LinkState(
                name, admin_up=True, operstate="UP" if up else "LOWERLAYERDOWN", carrier=up,
                carrier_changes=self.network.carrier_changes.get((self.node, net), 0),
                mtu=MTU[net], counters=dict.fromkeys(
                    ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped"), 0),
                speed_mbps=SPEED_MBPS if up else None)
        return out
