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
