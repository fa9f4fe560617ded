"""A throwaway network lab for the ping check: one network namespace per peer,
joined to the root namespace by a veth pair, with faults to inject.

The root end of each pair lives in THIS process's namespace, so the check pings the
peers directly (no setns). Every peer gets an IPv4 address from 10.200-249.x.0/24
and an IPv6 address from a ULA fd00:TTTT:x::/64 (TTTT is a random non-zero token,
so the lab never overlaps fd00::/64 or another lab); DAD is off so IPv6 works at
once. Names carry the same token, so labs never collide and a leftover is obvious.
`close()` removes everything and is safe to call after a partial set-up. Netlink
calls use pyroute2's asyncio API, as the tests run inside an event loop.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass

import anyio
from pyroute2 import AsyncIPRoute, netns

from checks.base import Peer

IFA_F_NODAD = 0x02  # linux/if_addr.h: skip duplicate address detection
PREFIX4, PREFIX6 = 24, 64

# nftables ruleset that drops ICMP echo requests arriving in a namespace.
DROP_ECHO = """
table inet healthd_fault {
    chain input {
        type filter hook input priority 0; policy accept;
        icmp type echo-request drop
        icmpv6 type echo-request drop
    }
}
"""

# The same, for echo requests that arrive on one interface only.
DROP_ECHO_ON = """
table inet healthd_fault {
    chain input {
        type filter hook input priority 0; policy accept;
        iifname "IFACE" icmp type echo-request drop
        iifname "IFACE" icmpv6 type echo-request drop
    }
}
"""


@dataclass(frozen=True)
class Host:
    """One peer of the lab: its namespace, its veth ends and both address pairs."""

    name: str
    netns: str
    root_if: str
    peer_if: str
    v4: tuple[str, str]  # (root end, peer end)
    v6: tuple[str, str]

    @property
    def peer(self) -> Peer:
        return Peer(self.name, (self.v4[1], self.v6[1]))


class NetLab:
    """Creates peers on demand and injects faults into them."""

    def __init__(self) -> None:
        self.token = secrets.randbelow(0xFFFE) + 1
        self.hosts: dict[str, Host] = {}

    async def add_peer(self, name: str) -> Peer:
        host = self._plan(name, len(self.hosts))
        self.hosts[name] = host  # recorded first, so close() cleans a half-built peer
        netns.create(host.netns)
        async with AsyncIPRoute() as ipr:
            await ipr.link(
                "add",
                ifname=host.root_if,
                kind="veth",
                peer={"ifname": host.peer_if, "net_ns_fd": host.netns},
            )
            await _configure(ipr, host.root_if, host.v4[0], host.v6[0])
        async with AsyncIPRoute(netns=host.netns) as ns:
            await _configure(ns, host.peer_if, host.v4[1], host.v6[1])
            await ns.link("set", index=await _index(ns, "lo"), state="up")
        return host.peer

    def _plan(self, name: str, i: int) -> Host:
        tag = f"{self.token:04x}{i:02d}"
        octet = 200 + self.token % 50
        return Host(
            name=name,
            netns=f"healthd-test-{tag}",
            root_if=f"hd{tag}r",
            peer_if=f"hd{tag}p",
            v4=(f"10.{octet}.{i}.1", f"10.{octet}.{i}.2"),
            v6=(f"fd00:{self.token:x}:{i}::1", f"fd00:{self.token:x}:{i}::2"),
        )

    async def link_down(self, name: str) -> None:
        """Take the peer's own end of the link down (as a dead NIC would)."""
        host = self.hosts[name]
        async with AsyncIPRoute(netns=host.netns) as ns:
            await ns.link("set", index=await _index(ns, host.peer_if), state="down")

    async def blackhole(self, name: str, families: tuple[int, ...] = (4, 6)) -> None:
        """Blackhole the peer's route back to us, so its replies go nowhere."""
        host = self.hosts[name]
        async with AsyncIPRoute(netns=host.netns) as ns:
            if 4 in families:
                await ns.route("add", dst=f"{host.v4[0]}/32", type="blackhole")
            if 6 in families:
                await ns.route("add", dst=f"{host.v6[0]}/128", type="blackhole")

    async def drop_echo(self, name: str, nft: str) -> None:
        """An nftables rule in the peer's namespace that drops echo requests."""
        cmd = ["ip", "netns", "exec", self.hosts[name].netns, nft, "-f", "-"]
        await anyio.run_process(cmd, input=DROP_ECHO.encode(), check=True)

    async def close(self) -> None:
        """Remove every veth pair and namespace this lab made; never raises."""
        async with AsyncIPRoute() as ipr:
            for host in self.hosts.values():
                for index in await ipr.link_lookup(ifname=host.root_if):
                    with contextlib.suppress(Exception):  # go on past one failure
                        await ipr.link("del", index=index)
        existing = set(netns.listnetns())
        for host in self.hosts.values():
            if host.netns in existing:
                with contextlib.suppress(Exception):
                    netns.remove(host.netns)
        self.hosts.clear()


async def _index(ipr: AsyncIPRoute, ifname: str) -> int:
    return int((await ipr.link_lookup(ifname=ifname))[0])


async def _configure(ipr: AsyncIPRoute, ifname: str, v4: str, v6: str) -> None:
    index = await _index(ipr, ifname)
    await ipr.addr("add", index=index, address=v4, prefixlen=PREFIX4)
    await ipr.addr("add", index=index, address=v6, prefixlen=PREFIX6, flags=IFA_F_NODAD)
    await ipr.link("set", index=index, state="up")


# -- a fabric of hosts with two networks -----------------------------------------------
#
# The ping check's per-network view and the nic check need hosts that, like GPU pods
# under Multus, sit on the pod network (`eth0`) and on a secondary network (`net1`).
# Each network is a Linux bridge in a "switch" namespace of its own; every host is a
# namespace with one veth pair per network: `eth0`/`net1` inside the host, the other
# end enslaved to that network's bridge. Nothing touches the root namespace's links.

NETWORKS = ("pod", "net1")
INTERFACES = {"pod": "eth0", "net1": "net1"}


@dataclass(frozen=True)
class FabricHost:
    """One host of the fabric: its namespace and addresses per network."""

    name: str
    netns: str
    index: int
    addresses: dict[str, tuple[str, str]]  # network -> (IPv4, IPv6)
    switch_ports: dict[str, str]  # network -> the bridge-side end of its veth

    def peer(self, networks: tuple[str, ...] = NETWORKS) -> Peer:
        """The host as the ping check's peer: pod addresses plus secondary networks."""
        return Peer(self.name, self.addresses["pod"],
                    {n: self.addresses[n] for n in networks if n != "pod"})


class Fabric:
    """Hosts on two bridged networks, with faults per (host, network)."""

    def __init__(self) -> None:
        self.token = secrets.randbelow(0xFFFE) + 1
        self.switch = f"healthd-test-{self.token:04x}sw"
        self.hosts: dict[str, FabricHost] = {}
        self._made_switch = False

    def _bridge(self, network: str) -> str:
        return f"br-{network}"

    async def start(self, names: tuple[str, ...]) -> list[FabricHost]:
        netns.create(self.switch)
        self._made_switch = True
        async with AsyncIPRoute(netns=self.switch) as sw:
            for network in NETWORKS:
                await sw.link("add", ifname=self._bridge(network), kind="bridge")
                await sw.link("set", index=await _index(sw, self._bridge(network)), state="up")
        return [await self._add_host(name, i) for i, name in enumerate(names)]

    async def _add_host(self, name: str, i: int) -> FabricHost:
        octet = 200 + self.token % 50
        subnets = {"pod": 100, "net1": 101}
        host = FabricHost(
            name=name, netns=f"healthd-test-{self.token:04x}h{i}", index=i,
            addresses={n: (f"10.{octet}.{subnets[n]}.{i + 1}",
                           f"fd00:{self.token:x}:{subnets[n]}::{i + 1}") for n in NETWORKS},
            switch_ports={n: f"{n[:3]}{i}" for n in NETWORKS})
        self.hosts[name] = host
        netns.create(host.netns)
        async with AsyncIPRoute(netns=self.switch) as sw:
            for network in NETWORKS:
                port = host.switch_ports[network]
                await sw.link("add", ifname=port, kind="veth",
                              peer={"ifname": INTERFACES[network], "net_ns_fd": host.netns})
                index = await _index(sw, port)
                await sw.link("set", index=index,
                              master=await _index(sw, self._bridge(network)))
                await sw.link("set", index=index, state="up")
        async with AsyncIPRoute(netns=host.netns) as ns:
            for network in NETWORKS:
                v4, v6 = host.addresses[network]
                await _configure(ns, INTERFACES[network], v4, v6)
            await ns.link("set", index=await _index(ns, "lo"), state="up")
        return host

    async def unplug(self, name: str, network: str) -> None:
        """Take the switch side of the host's link down: the host's NIC loses its
        carrier, as with a dead cable, transceiver or switch port."""
        port = self.hosts[name].switch_ports[network]
        async with AsyncIPRoute(netns=self.switch) as sw:
            await sw.link("set", index=await _index(sw, port), state="down")

    async def replug(self, name: str, network: str) -> None:
        """Bring the switch side of the host's link back up."""
        port = self.hosts[name].switch_ports[network]
        async with AsyncIPRoute(netns=self.switch) as sw:
            await sw.link("set", index=await _index(sw, port), state="up")

    async def set_mtu(self, name: str, network: str, mtu: int) -> None:
        host = self.hosts[name]
        async with AsyncIPRoute(netns=host.netns) as ns:
            await ns.link("set", index=await _index(ns, INTERFACES[network]), mtu=mtu)

    async def blackhole(self, name: str, network: str) -> None:
        """Blackhole the host's routes back to every other host's `network` address."""
        host = self.hosts[name]
        async with AsyncIPRoute(netns=host.netns) as ns:
            for other in self.hosts.values():
                if other.name != name:
                    v4, v6 = other.addresses[network]
                    await ns.route("add", dst=f"{v4}/32", type="blackhole")
                    await ns.route("add", dst=f"{v6}/128", type="blackhole")

    async def drop_echo(self, name: str, network: str, nft: str) -> None:
        """nftables in the host's namespace drops echo requests arriving on `network`."""
        ruleset = DROP_ECHO_ON.replace("IFACE", INTERFACES[network])
        cmd = ["ip", "netns", "exec", self.hosts[name].netns, nft, "-f", "-"]
        await anyio.run_process(cmd, input=ruleset.encode(), check=True)

    async def close(self) -> None:
        """Remove every namespace (their veths and bridges go with them); never raises."""
        existing = set(netns.listnetns())
        names = [h.netns for h in self.hosts.values()]
        if self._made_switch:
            names.append(self.switch)
        for name in names:
            if name in existing:
                with contextlib.suppress(Exception):
                    netns.remove(name)
        self.hosts.clear()
