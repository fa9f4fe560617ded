"""The `rdma` check: the RDMA ports behind GPU-direct traffic (InfiniBand or RoCE).

Multi-node training moves its data over the NICs in `/sys/class/infiniband/*/ports/*`
(what `nvidia.com/roce_gdr` and InfiniBand resources hand to pods); the `nic` check,
which reads netdevs, does not see them. Per port (`Entity("rdma", "mlx5_0/1")`, with
the network it serves where its netdev is one of this pod's Multus interfaces), from
sysfs: `state` (`4: ACTIVE`), `phys_state` (`5: LinkUp`), `link_layer`, `rate`
(`400 Gb/sec (4X NDR)`) and the error counters under `counters/`:

- `RDMA_PORT_DOWN`: the port is not ACTIVE, or its physical link is not LinkUp;
- `RDMA_RATE_LOW`: the port runs below the expected rate (`expected_rate_gbps`, or
  else the fastest port of the same link layer on this node: the NICs of one node
  are alike, a slower one has trained down);
- `RDMA_ERRORS`: error counters (`link_downed`, `symbol_error`, `port_rcv_errors`,
  `excessive_buffer_overrun_errors`, ...) grew by more than `max_error_growth` since
  the last round. Growth needs two rounds; the first only takes the baseline, and a
  counter that went back (a driver reload) starts a new one.

The agent damps these like every steady signal (the catalog's raise rules, then
`recover_after` passing runs and the minimum hold); a port that went down is raised
on its first sighting. Ports are read through an `RdmaReader`: the real one reads
sysfs under `sysfs_root` (tests and the simulation point it at a fake tree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from checks.base import (
    BaseCheck,
    CheckContext,
    CheckResult,
    Entity,
    Measure,
    ResultBuilder,
    measures,
)
from checks.probes import Probes, RdmaPort

SYSFS_INFINIBAND = Path("/sys/class/infiniband")
ERROR_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors",
                  "excessive_buffer_overrun_errors", "local_link_integrity_errors",
                  "link_error_recovery", "port_xmit_discards", "port_rcv_remote_physical_errors")


class RdmaUnavailable(Exception):
    """The ports cannot be read; `not_recorded` for a replay that holds none."""

    def __init__(self, reason: str, *, not_recorded: bool = False) -> None:
        super().__init__(reason)
        self.not_recorded = not_recorded


@dataclass(frozen=True)
class SysfsRdmaReader:
    """The real reader: `<root>/<device>/ports/<n>/...` and the device's netdevs in
    `<root>/<device>/device/net/`. No root (no RDMA driver loaded): no ports."""

    root: Path = SYSFS_INFINIBAND

    def read(self) -> list[RdmaPort]:
        if not self.root.is_dir():
            return []
        try:
            return [self._port(device, port)
                    for device in sorted(self.root.iterdir())
                    for port in sorted((device / "ports").iterdir(), key=_port_number)]
        except (OSError, ValueError) as exc:
            raise RdmaUnavailable(f"cannot read {self.root}: {exc}") from exc

    def _port(self, device: Path, port: Path) -> RdmaPort:
        counters = {}
        for name in ERROR_COUNTERS:
            value = _read(port / "counters" / name)
            if value:
                counters[name] = int(value)
        net = device / "device" / "net"
        return RdmaPort(
            device=device.name, port=_port_number(port),
            state=_after_colon(_read(port / "state")),
            phys_state=_after_colon(_read(port / "phys_state")),
            link_layer=_read(port / "link_layer") or "InfiniBand",
            rate_gbps=parse_rate(_read(port / "rate")),
            counters=counters,
            netdevs=tuple(sorted(p.name for p in net.iterdir())) if net.is_dir() else (),
        )


def parse_rate(text: str) -> float | None:
    """Gb/s from sysfs `rate` (`400 Gb/sec (4X NDR)`); None when absent or unreadable."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def _after_colon(text: str) -> str:
    """`ACTIVE` from `4: ACTIVE`."""
    return text.partition(":")[2].strip() or text.strip()


def _port_number(port: Path) -> int:
    return int(port.name)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


class RdmaParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sysfs_root: str = Field(str(SYSFS_INFINIBAND), description="where the RDMA devices are")
    expected_rate_gbps: float | None = Field(
        None, gt=0, description="the rate every port should run at (unset: the node's fastest)")
    max_error_growth: int = Field(
        0, ge=0, description="error counter growth per round above which RDMA_ERRORS")


class RdmaCheck(BaseCheck):
    """State, physical state, rate and error growth of every RDMA port."""

    NAME: ClassVar[str] = "rdma"
    Params: ClassVar[type[BaseModel]] = RdmaParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0
    DESCRIPTION: ClassVar[str] = "RDMA ports (InfiniBand/RoCE): state, rate, error counters"
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_rdma_port_up", "1 when the RDMA port is ACTIVE with its physical "
                "link up.", "up", "rdma"),
        Measure("healthd_rdma_port_rate_gbps", "The RDMA port's rate in Gb/s.", "rate_gbps",
                "rdma"),
        *measures("healthd_rdma_port_errors", "The RDMA port's error counters, as sysfs shows "
                  "them.", "counter", {name: name for name in ERROR_COUNTERS}, kind="rdma"),
    )
    CODES: ClassVar[tuple[str, ...]] = ("RDMA_PORT_DOWN", "RDMA_RATE_LOW", "RDMA_ERRORS")

    params: RdmaParams

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None, *,
                 probes: Probes | None = None) -> None:
        super().__init__(params, probes=probes)
        self._previous: dict[str, Mapping[str, int]] = {}  # per port, the last round's

    async def run(self, ctx: CheckContext) -> CheckResult:
        reader = self.probes.rdma or SysfsRdmaReader(Path(self.params.sysfs_root))
        try:
            ports = await anyio.to_thread.run_sync(reader.read)
        except RdmaUnavailable as exc:
            if exc.not_recorded:
                return CheckResult.skipped(self.NAME, str(exc))
            return CheckResult.unknown(self.NAME, str(exc))
        if not ports:
            return CheckResult.skipped(self.NAME, "no RDMA devices")
        networks = {a.interface: a.network for a in ctx.attachments}
        builder = ResultBuilder(self.NAME, ctx.catalog)
        for port in ports:
            network = next((networks[n] for n in port.netdevs if n in networks), "")
            self._judge(builder, Entity("rdma", port.name, network=network), port,
                        self._expected_rate(port, ports))
        return builder.build()

    def _expected_rate(self, port: RdmaPort, ports: Sequence[RdmaPort]) -> float | None:
        if self.params.expected_rate_gbps is not None:
            return self.params.expected_rate_gbps
        rates = [p.rate_gbps for p in ports
                 if p.link_layer == port.link_layer and p.rate_gbps is not None]
        return max(rates, default=None)

    def _judge(self, builder: ResultBuilder, entity: Entity, port: RdmaPort,
               expected: float | None) -> None:
        where = port.name + (f" ({', '.join(port.netdevs)})" if port.netdevs else "")
        values: dict[str, int | float | str] = {
            "state": port.state, "phys_state": port.phys_state, "link_layer": port.link_layer,
            "up": int(port.up),
            **({"rate_gbps": port.rate_gbps} if port.rate_gbps is not None else {}),
            **({"netdev": ",".join(port.netdevs)} if port.netdevs else {}), **port.counters}
        builder.seen(entity, **values)
        if not port.up:
            builder.finding("RDMA_PORT_DOWN", entity,
                            f"RDMA port {where} is down: state {port.state or '?'}, physical "
                            f"state {port.phys_state or '?'}", state=port.state,
                            phys_state=port.phys_state)
        elif port.rate_gbps is not None and expected is not None and port.rate_gbps < expected:
            builder.finding("RDMA_RATE_LOW", entity,
                            f"RDMA port {where} runs at {port.rate_gbps:g} Gb/s, expected "
                            f"{expected:g} Gb/s", rate_gbps=port.rate_gbps,
                            expected_rate_gbps=expected)
        self._growth(builder, entity, where, port)

    def _growth(self, builder: ResultBuilder, entity: Entity, where: str, port: RdmaPort) -> None:
        before = self._previous.get(port.name)
        self._previous[port.name] = dict(port.counters)
        if before is None:
            return  # the first round only takes the baseline
        grew = {name: value - before.get(name, value) for name, value in port.counters.items()}
        if any(delta < 0 for delta in grew.values()):
            return  # counters reset (driver reload): a new baseline, no judgement
        growing = {name: delta for name, delta in grew.items() if delta > 0}
        if sum(growing.values()) > self.params.max_error_growth:
            listed = ", ".join(f"{name} +{delta}" for name, delta in sorted(growing.items()))
            builder.finding("RDMA_ERRORS", entity,
                            f"RDMA port {where} error counters grew since the last check: "
                            f"{listed}", errors_delta=sum(growing.values()))
