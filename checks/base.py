"""The check contract: what a check is, what it reports, and how severities order.

A check observes hardware (GPUs, links, storage, peers) and reports what it saw as
`Finding`s about `Entity`s. It never raises for a hardware problem; it reports it.
An exception or a timeout means the check could not tell, which `run_check` turns
into an UNKNOWN result with the reason: never a crash, never a PASS.

Severity order: PASS < WARN < ERR < EVICT. UNKNOWN ("could not tell") and SKIPPED
("does not apply here") stand outside the order.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from checks.catalog import Catalog
    from checks.nic import LinkReader
    from checks.pciebw import BandwidthProbe
    from checks.ping import Prober
    from checks.pvc_api import ProbeApiFactory
    from checks.snapshot import GpuSource

Value = int | float | str | bool


class Severity(enum.StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    ERR = "ERR"
    EVICT = "EVICT"
    UNKNOWN = "UNKNOWN"
    SKIPPED = "SKIPPED"

    @property
    def ordered(self) -> bool:
        """True for the four severities that have an order."""
        return self in _ORDER

    @property
    def rank(self) -> int:
        """Position in PASS < WARN < ERR < EVICT; -1 for UNKNOWN and SKIPPED."""
        return _ORDER.get(self, -1)

    @property
    def exit_code(self) -> int:
        """Nagios convention: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."""
        return _EXIT_CODES[self]


_ORDER = {Severity.PASS: 0, Severity.WARN: 1, Severity.ERR: 2, Severity.EVICT: 3}
_EXIT_CODES = {
    Severity.PASS: 0,
    Severity.SKIPPED: 0,
    Severity.WARN: 1,
    Severity.ERR: 2,
    Severity.EVICT: 2,
    Severity.UNKNOWN: 3,
}


def worst(severities: Iterable[Severity]) -> Severity:
    """Combine statuses: the worst ordered one wins over UNKNOWN only when it is ERR or
    EVICT (an unknown check may hide a fault, so UNKNOWN outranks PASS and WARN).
    SKIPPED counts only when everything was skipped; nothing at all is PASS."""
    seen = list(severities)
    ordered = [s for s in seen if s.ordered]
    top = max(ordered, key=lambda s: s.rank) if ordered else None
    if top is not None and top.rank >= Severity.ERR.rank:
        return top
    if Severity.UNKNOWN in seen:
        return Severity.UNKNOWN
    if top is not None:
        return top
    return Severity.SKIPPED if seen else Severity.PASS


EntityKind = Literal["gpu", "node", "peer", "storage", "network", "nic"]

# The pod network (the cluster network every pod has) as a network name; secondary
# networks (Multus attachments) go by their attachment's name, e.g. `net1`.
POD_NETWORK = "pod"


@dataclass(frozen=True, order=True)
class Entity:
    """What a finding is about: a GPU (by index, with UUID and PCI bus id), the node
    itself, a peer node (on one network: `network` is empty for the pod network), a
    storage class, a secondary network, or a secondary network interface (`nic`)."""

    kind: EntityKind
    name: str
    uuid: str = ""
    pci_bus_id: str = ""
    model: str = ""
    network: str = ""  # peers and NICs on a secondary network; "" = the pod network

    @classmethod
    def gpu(cls, index: int, uuid: str = "", pci_bus_id: str = "", model: str = "") -> Entity:
        return cls("gpu", str(index), uuid, pci_bus_id, model)

    @classmethod
    def node(cls, name: str) -> Entity:
        return cls("node", name)

    @classmethod
    def peer(cls, name: str, network: str = "") -> Entity:
        """A peer node as probed on `network` ("" or POD_NETWORK: the pod network)."""
        return cls("peer", name, network="" if network == POD_NETWORK else network)

    @property
    def index(self) -> int | None:
        """The GPU index, for GPU entities."""
        return int(self.name) if self.kind == "gpu" else None

    @property
    def label(self) -> str:
        """Short name for tables and logs: `gpu3`, `node`, `peer/n2`, `peer/n2@net1`,
        `storage/fast`, `network/net1`, `nic/net1`."""
        if self.kind == "gpu":
            return f"gpu{self.name}"
        if self.kind == "node":
            return "node"
        if self.kind == "peer" and self.network:
            return f"peer/{self.name}@{self.network}"
        return f"{self.kind}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.kind == "gpu":
            out["index"] = self.index
        for key in ("uuid", "pci_bus_id", "model", "network"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class Finding:
    """One observation of a problem about one entity. `code` is stable upper snake
    case (see checks.catalog); severity and stickiness come from the catalog."""

    code: str
    severity: Severity
    entity: Entity
    message: str
    sticky: bool = False
    values: Mapping[str, Value] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "sticky": self.sticky,
            "entity": self.entity.to_json(),
            "message": self.message,
            "values": dict(self.values),
        }


@dataclass(frozen=True)
class EntityStatus:
    """What one check concluded about one entity, with the values it measured."""

    entity: Entity
    status: Severity
    values: Mapping[str, Value] = field(default_factory=dict)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "entity": self.entity.to_json(),
            "status": self.status.value,
            "values": dict(self.values),
        }
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one run of one check."""

    check: str
    status: Severity
    findings: tuple[Finding, ...] = ()
    entities: tuple[EntityStatus, ...] = ()
    reason: str = ""
    started_at: float = 0.0
    duration_s: float = 0.0
    # A SKIPPED an admin should act on (a tool or service the check needs is missing),
    # unlike a check that has nothing to do by configuration: the agent says so once.
    actionable: bool = False

    @classmethod
    def unknown(cls, check: str, reason: str) -> CheckResult:
        return cls(check=check, status=Severity.UNKNOWN, reason=reason)

    @classmethod
    def skipped(cls, check: str, reason: str, *, actionable: bool = False) -> CheckResult:
        return cls(check=check, status=Severity.SKIPPED, reason=reason, actionable=actionable)

    def timed(self, started_at: float, duration_s: float) -> CheckResult:
        return _replace(self, started_at=started_at, duration_s=duration_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.value,
            "reason": self.reason,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 6),
            "entities": [e.to_json() for e in self.entities],
            "findings": [f.to_json() for f in self.findings],
        }


def _replace(result: CheckResult, **changes: Any) -> CheckResult:
    from dataclasses import replace

    return replace(result, **changes)


class ResultBuilder:
    """Collects what a check saw, entity by entity, and builds its CheckResult.

    Every entity examined is recorded (so healthy GPUs show as PASS rows); findings
    take their severity and stickiness from the catalog."""

    def __init__(self, check: str, catalog: Catalog) -> None:
        self.check = check
        self.catalog = catalog
        self._values: dict[Entity, dict[str, Value]] = {}
        self._fixed: dict[Entity, tuple[Severity, str]] = {}
        self._findings: list[Finding] = []

    def seen(self, entity: Entity, **values: Value) -> None:
        """Record that `entity` was examined, with measured values."""
        self._values.setdefault(entity, {}).update(values)

    def skip(self, entity: Entity, reason: str) -> None:
        """The check does not apply to this entity (e.g. a property NVML does not
        support on this GPU)."""
        self.seen(entity)
        self._fixed.setdefault(entity, (Severity.SKIPPED, reason))

    def unknown(self, entity: Entity, reason: str) -> None:
        """The check could not tell for this entity."""
        self.seen(entity)
        self._fixed[entity] = (Severity.UNKNOWN, reason)

    def finding(self, code: str, entity: Entity, message: str, **values: Value) -> Finding:
        spec = self.catalog.lookup(code)
        found = Finding(code, spec.severity, entity, message, spec.sticky, values)
        self.seen(entity, **values)
        self._findings.append(found)
        return found

    def build(self, reason: str = "") -> CheckResult:
        statuses = tuple(self._entity_status(e) for e in sorted(self._values))
        status = worst(s.status for s in statuses) if statuses else Severity.PASS
        return CheckResult(
            check=self.check,
            status=status,
            findings=tuple(self._findings),
            entities=statuses,
            reason=reason,
        )

    def _entity_status(self, entity: Entity) -> EntityStatus:
        mine = [f.severity for f in self._findings if f.entity == entity]
        fixed, reason = self._fixed.get(entity, (None, ""))
        if mine:
            # A finding decides (e.g. GPU lost) even where a property was unreadable.
            status = worst(mine + ([fixed] if fixed is Severity.UNKNOWN else []))
        else:
            status = fixed or Severity.PASS
        return EntityStatus(entity, status, self._values[entity], reason)


class NoParams(BaseModel):
    """Parameters of a check that takes none."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass
class Peer:
    """Another node to probe: its name, its pod-network addresses (IPv4 and/or IPv6)
    and, per secondary network it is attached to, its addresses there."""

    name: str
    addresses: Sequence[str]
    networks: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Attachment:
    """One interface this node's own pod has on a secondary network (from Multus):
    what the `nic` check inspects."""

    network: str
    interface: str
    addresses: tuple[str, ...] = ()


@dataclass
class CheckContext:
    """What a check gets from outside: the finding catalog, the GPUs, the node's
    identity and, for the checks that need them, peers and the pvc probe's API.

    `gpus` serves ONE NVML pass per round to every NVML check (see checks.snapshot)."""

    catalog: Catalog
    node_name: str = ""
    gpus: GpuSource | None = None
    expected_gpus: int | None = None
    peers: Sequence[Peer] = ()
    pvc_api: ProbeApiFactory | None = None  # the pvc check's door to the cluster
    attachments: Sequence[Attachment] = ()  # this pod's secondary interfaces (nic)
    link_reader: LinkReader | None = None  # None: netlink in this namespace
    bandwidth_probe: BandwidthProbe | None = None  # None: the real CUDA probe
    ping_prober: Prober | None = None  # None: ICMP through icmplib
    namespace: str = "healthd-system"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probes:
    """What checks measure with besides NVML, when it is not the real thing: the
    simulator's stand-ins (None: the CUDA bandwidth probe, netlink, ICMP)."""

    bandwidth: BandwidthProbe | None = None
    links: LinkReader | None = None
    ping: Prober | None = None

    def apply(self, ctx: CheckContext) -> None:
        """Point `ctx` at these probes."""
        ctx.bandwidth_probe, ctx.link_reader = self.bandwidth, self.links
        ctx.ping_prober = self.ping


@runtime_checkable
class Check(Protocol):
    """One health check instance, as the code that runs checks sees it: its name, its
    validated parameters, whether it needs the GPUs to itself, its deadline, and
    `run`, which performs it once. Check classes derive from `BaseCheck`, whose class
    attributes describe them."""

    @property
    def NAME(self) -> str:
        ...

    @property
    def params(self) -> BaseModel: ...

    @property
    def exclusive(self) -> bool: ...

    @property
    def timeout_s(self) -> float: ...

    async def run(self, ctx: CheckContext) -> CheckResult: ...


class BaseCheck:
    """The base of every check class: stores validated params; subclasses set the
    class attributes and implement `run`.

    - NAME: stable name used in config, CLI and labels (`remapped`, `dcgm`, ...)
    - Params: pydantic model of its parameters (`NoParams` when it has none)
    - ARG: the parameter that `name:value` on the command line sets (`dcgm:3`), if any
    - DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S: schedule defaults for the agent
    - EXCLUSIVE: needs all GPUs to itself (deep diagnostics)
    - INPUTS: what it reads from the machine, by the names a recording
      (`healthd record`) gives its sources (`nvml`, `xid`, `pciebw`, `dcgm`, ...);
      None: one source named like the check. A replay runs it only when the
      recording holds every one (see `inputs_of`).
    """

    NAME: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    ARG: ClassVar[str | None] = None
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0
    EXCLUSIVE: ClassVar[bool] = False
    DESCRIPTION: ClassVar[str] = ""
    INPUTS: ClassVar[frozenset[str] | None] = None

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None) -> None:
        if isinstance(params, BaseModel):
            self.params = self.Params.model_validate(params.model_dump())
        else:
            self.params = self.Params.model_validate(dict(params or {}))

    @property
    def exclusive(self) -> bool:
        """Whether this instance needs the GPUs to itself (may depend on params)."""
        return self.EXCLUSIVE

    @property
    def timeout_s(self) -> float:
        """This instance's deadline (may depend on params, e.g. the DCGM level)."""
        return self.DEFAULT_TIMEOUT_S

    async def run(self, ctx: CheckContext) -> CheckResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


def inputs_of(check: Check) -> frozenset[str]:
    """The sources `check` reads (its INPUTS, else one named like the check)."""
    declared = getattr(check, "INPUTS", None)
    return frozenset(declared) if declared is not None else frozenset({check.NAME})


async def run_check(check: Check, ctx: CheckContext, timeout_s: float | None = None) -> CheckResult:
    """Run one check under a deadline. An exception or a timeout becomes UNKNOWN with
    the reason; the result is stamped with its start time and duration."""
    limit = check.timeout_s if timeout_s is None else timeout_s
    started_wall, started = time.time(), time.monotonic()
    result: CheckResult | None = None
    try:
        with anyio.move_on_after(limit):
            result = await check.run(ctx)
        if result is None:
            result = CheckResult.unknown(check.NAME, f"timed out after {limit:g} s")
    except Exception as exc:  # a broken check must never take the caller down
        result = CheckResult.unknown(check.NAME, f"check failed: {type(exc).__name__}: {exc}")
    return result.timed(started_wall, time.monotonic() - started)
