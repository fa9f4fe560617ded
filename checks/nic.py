"""The `nic` check: are this pod's secondary network interfaces healthy?

GPU training traffic runs over secondary networks (RoCE/InfiniBand-backed
interfaces attached by Multus), not the pod network. For every secondary interface
the pod has (`CheckContext.attachments`, from its own Multus `network-status`), the
check reads the link through netlink in the pod's own network namespace (read-only
`RTM_GETLINK` dumps: no capability needed) and reports, per interface
(`Entity("nic", <interface>, network=<network>)`):

- `NIC_MISSING`: the interface Multus attached is not in the namespace;
- `NIC_DOWN`: the link is administratively down, has no carrier, or its operstate
  is not up, on a training network (`NIC_DOWN_AUXILIARY` on one marked
  `training: false`);
- `NIC_FLAPPING`: the carrier-change count grew since the last round;
- `NIC_MTU_MISMATCH`: the MTU differs from the network's expected MTU (config);
- `NIC_ERRORS`: RX/TX error or drop counters (IFLA_STATS64) grew faster than the
  configured rates between two rounds;
- `NIC_SPEED_LOW`: the link speed (sysfs `speed`: netlink does not carry it) is
  below the network's expected minimum.

Growth needs two rounds: the first run of the check only takes the baseline. The
link reads go through a `LinkReader`; `NetlinkReader` is the real one (pyroute2),
the simulation builds the check with its own (`Probes.links`, checks.probes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from checks.base import Attachment, BaseCheck, CheckContext, CheckResult, Entity, ResultBuilder
from checks.probes import LinkReader, LinkState, Probes

SYSFS_NET = Path("/sys/class/net")
COUNTERS = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped")


IFF_UP = 0x1  # linux/if.h


@dataclass(frozen=True)
class NetlinkReader:
    """The real reader: one RTM_GETLINK dump in this process's network namespace
    (`netns` names another one, for tests), link speed from sysfs."""

    netns: str | None = None
    sysfs: Path = SYSFS_NET

    async def read(self, interfaces: Sequence[str]) -> Mapping[str, LinkState]:
        # Imported on the first read, not with the check: pyroute2 costs ~10 MiB of
        # memory, and a node with no secondary interface (or a simulated one) never
        # reads a link.
        from pyroute2 import AsyncIPRoute

        wanted = set(interfaces)
        found: dict[str, LinkState] = {}
        async with AsyncIPRoute(netns=self.netns) as ipr:
            async for link in await ipr.get_links():
                name = link.get("IFLA_IFNAME")
                if name in wanted:
                    found[name] = self._state(name, link)
        return found

    def _state(self, name: str, link: Any) -> LinkState:
        stats = link.get("IFLA_STATS64") or {}
        return LinkState(
            interface=name,
            admin_up=bool(link["flags"] & IFF_UP),
            operstate=str(link.get("IFLA_OPERSTATE") or "UNKNOWN"),
            carrier=bool(link.get("IFLA_CARRIER")),
            carrier_changes=int(link.get("IFLA_CARRIER_CHANGES") or 0),
            mtu=int(link.get("IFLA_MTU") or 0),
            counters={c: int(stats.get(c, 0)) for c in COUNTERS},
            speed_mbps=read_speed(self.sysfs / name / "speed"),
        )


def read_speed(path: Path) -> int | None:
    """Mb/s from a sysfs `speed` file; None when absent, unreadable or unknown (-1:
    no link, or a virtual device)."""
    try:
        speed = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


class NetworkExpectation(BaseModel):
    """What a healthy interface on one secondary network looks like."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mtu: int | None = Field(None, ge=68, le=65536, description="expected MTU")
    min_speed_mbps: int | None = Field(None, ge=1, description="lowest acceptable speed")
    training: bool = Field(
        True, description="carries training traffic: a dead link is ERR (else WARN)"
    )


class NicParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    networks: Literal["all"] | tuple[str, ...] = Field(
        "all", description="secondary networks whose interfaces are checked"
    )
    expect: dict[str, NetworkExpectation] = Field(
        default_factory=dict, description="per network name: mtu, min_speed_mbps, training"
    )
    max_errors_per_s: float = Field(
        0.0, ge=0, description="RX+TX errors per second above which NIC_ERRORS"
    )
    max_drops_per_s: float = Field(
        10.0, ge=0, description="RX+TX drops per second above which NIC_ERRORS"
    )


@dataclass(frozen=True)
class _Sample:
    at: float
    carrier_changes: int
    counters: Mapping[str, int]


class NicCheck(BaseCheck):
    """Link state, MTU, speed and error growth of every secondary interface."""

    NAME: ClassVar[str] = "nic"
    Params: ClassVar[type[BaseModel]] = NicParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 60.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0
    DESCRIPTION: ClassVar[str] = "secondary network interfaces: link, MTU, speed, errors"
    CODES: ClassVar[tuple[str, ...]] = (
        "NIC_DOWN", "NIC_DOWN_AUXILIARY", "NIC_MISSING", "NIC_FLAPPING", "NIC_MTU_MISMATCH",
        "NIC_ERRORS", "NIC_SPEED_LOW")

    params: NicParams

    def __init__(
        self,
        params: BaseModel | Mapping[str, Any] | None = None,
        *,
        probes: Probes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(params, probes=probes)
        self._clock = clock
        self._previous: dict[str, _Sample] = {}  # per interface, from the last round

    async def run(self, ctx: CheckContext) -> CheckResult:
        # An attachment without an interface name (a CNI that reports none) has
        # nothing to read.
        attachments = [a for a in ctx.attachments if a.interface and self._wanted(a.network)]
        if not attachments:
            return CheckResult.skipped(self.NAME, "no secondary network interfaces to check")
        reader: LinkReader = self.probes.links or NetlinkReader()
        try:
            links = await reader.read([a.interface for a in attachments])
        except OSError as exc:
            return CheckResult.unknown(self.NAME, f"cannot read links over netlink: {exc}")
        now = self._clock()
        builder = ResultBuilder(self.NAME, ctx.catalog)
        for attachment in attachments:
            link = links.get(attachment.interface)
            entity = Entity("nic", attachment.interface, network=attachment.network)
            if link is None:
                builder.finding(
                    "NIC_MISSING", entity,
                    f"{attachment.interface} ({attachment.network}) is attached by Multus "
                    "but not present in the pod's network namespace")
                continue
            self._judge(builder, entity, attachment, link, now)
        return builder.build()

    def _wanted(self, network: str) -> bool:
        return self.params.networks == "all" or network in self.params.networks

    def _judge(self, builder: ResultBuilder, entity: Entity, attachment: Attachment,
               link: LinkState, now: float) -> None:
        expect = self.params.expect.get(attachment.network, NetworkExpectation())
        where = f"{link.interface} ({attachment.network})"
        values: dict[str, int | float | str] = {
            "operstate": link.operstate, "mtu": link.mtu,
            "carrier_changes": link.carrier_changes, **link.counters}
        if link.speed_mbps is not None:
            values["speed_mbps"] = link.speed_mbps
        builder.seen(entity, **values)
        if not link.up:
            code = "NIC_DOWN" if expect.training else "NIC_DOWN_AUXILIARY"
            builder.finding(code, entity, f"{where} is down: {_why_down(link)}", **values)
        if expect.mtu is not None and link.mtu != expect.mtu:
            builder.finding("NIC_MTU_MISMATCH", entity,
                            f"{where} has MTU {link.mtu}, the network expects {expect.mtu}",
                            mtu=link.mtu, expected_mtu=expect.mtu)
        if (expect.min_speed_mbps is not None and link.speed_mbps is not None
                and link.up and link.speed_mbps < expect.min_speed_mbps):
            builder.finding("NIC_SPEED_LOW", entity,
                            f"{where} runs at {link.speed_mbps} Mb/s, expected at least "
                            f"{expect.min_speed_mbps} Mb/s", speed_mbps=link.speed_mbps)
        self._growth(builder, entity, where, link, now)

    def _growth(self, builder: ResultBuilder, entity: Entity, where: str, link: LinkState,
                now: float) -> None:
        """Carrier changes and error/drop rates since the previous round."""
        before = self._previous.get(link.interface)
        self._previous[link.interface] = _Sample(now, link.carrier_changes, dict(link.counters))
        if before is None:
            return  # the first round only takes the baseline
        flaps = link.carrier_changes - before.carrier_changes
        if flaps > 0:
            builder.finding("NIC_FLAPPING", entity,
                            f"{where} lost or regained its carrier {flaps} times since the "
                            "last check", carrier_changes_delta=flaps)
        elapsed = max(now - before.at, 1e-3)
        grew = {c: link.counters.get(c, 0) - before.counters.get(c, 0) for c in COUNTERS}
        if any(d < 0 for d in grew.values()):
            return  # counters reset (driver reload): a new baseline, no judgement
        errors = (grew["rx_errors"] + grew["tx_errors"]) / elapsed
        drops = (grew["rx_dropped"] + grew["tx_dropped"]) / elapsed
        if errors > self.params.max_errors_per_s or drops > self.params.max_drops_per_s:
            builder.finding("NIC_ERRORS", entity,
                            f"{where} errors grow at {errors:.2f}/s and drops at "
                            f"{drops:.2f}/s", errors_per_s=round(errors, 3),
                            drops_per_s=round(drops, 3))


def _why_down(link: LinkState) -> str:
    if not link.admin_up:
        return "administratively down"
    if not link.carrier:
        return "no carrier (cable, transceiver or switch port)"
    return f"operstate {link.operstate}"
