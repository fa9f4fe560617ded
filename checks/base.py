"""The check contract: what a check is, what it reports, and how severities order.

A check observes hardware (GPUs, links, storage, peers) and reports what it saw as
`Finding`s about `Entity`s. It never raises for a hardware problem; it reports it.
An exception or a timeout means the check could not tell, which `run_check` turns
into an UNKNOWN result with the reason: never a crash, never a PASS. An exception is
a bug in the check, so its traceback is logged too: once per distinct fault (the
check, the exception's type and the line that raised it), not on every run, so a
check that fails every 30 s does not flood the log, and a new fault still shows.

A check gets two things from outside. What it measures with besides NVML (netlink,
ICMP, the CUDA probe, the kernel log, the pvc check's cluster API) comes when it is
built: `BaseCheck(params, probes=...)`, the protocols and `Probes` in checks.probes,
None being the real thing. What one run is about comes in a `CheckContext`: the node,
the catalog, that round's GPUs, peers and interfaces. The context is frozen: whoever
learns something new builds the next one, so a run never sees its inputs change. A
check that needs a new stand-in edits checks.probes and its own module, never this
one (an import contract keeps this module from knowing any check).

Severities and their order live in checks.severity (the catalog needs them too,
without the rest of the contract).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict

from checks.catalog import Catalog
from checks.probes import GpuSource, Kind, Probes
from checks.severity import Severity as Severity
from checks.severity import worst as worst

log = logging.getLogger(__name__)

Value = int | float | str | bool


EntityKind = Literal["gpu", "node", "peer", "storage", "network", "nic", "nvswitch", "rdma"]

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


@dataclass(frozen=True)
class Measure:
    """One value a check records on its entities (`EntityStatus.values[value]`), which
    the agent exports as a gauge `family`. Sibling values of one family are told apart
    by fixed labels (`extra`, e.g. `direction="h2d"`); `scale` converts the value to
    the family's unit (ms to seconds); `secondary` selects peers on a secondary
    network (else the pod network's); `texts` are labels whose values are text
    values of the entity (`(("action", "recovery_action"),)`: label `action` reads
    the value `recovery_action`), so an enumeration is one series named by its
    state. `kept`: a value that only moves forward (when something last happened):
    the agent exports the greatest any run of the check gave an entity, for as long
    as the check's runs name the entity, whether or not the latest run gave it."""

    family: str
    help: str
    value: str
    kind: EntityKind = "gpu"
    extra: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    secondary: bool = False
    texts: tuple[tuple[str, str], ...] = ()
    kept: bool = False


def measures(family: str, help: str, label: str, values: Mapping[str, str], *,
             kind: EntityKind = "gpu", scale: float = 1.0) -> tuple[Measure, ...]:
    """Sibling values of one family told apart by one label: `{label value: value key}`
    (`direction`: `{"h2d": "h2d_gbps", "d2h": "d2h_gbps"}`)."""
    return tuple(Measure(family, help, key, kind, ((label, v),), scale)
                 for v, key in values.items())


@dataclass(frozen=True)
class Counted:
    """Findings that stand for events (an XID, an SXID), which the agent counts into the
    counter `family`: per entity of `kind` (a GPU, an NVSwitch) and per the finding's
    `value` (the event's code number), by the finding's `count` value (else 1)."""

    family: str
    help: str
    value: str
    kind: EntityKind = "gpu"


@dataclass(frozen=True)
class AutopilotGauge:
    """How a check shows in Autopilot's `autopilot_health_checks` gauge, for the
    dashboards written for Autopilot: its `health` label, and what a sample is. `per`
    "gpu" or "peer": one sample per GPU index or pod-network peer, `value` from that
    entity's values (a measure key) or, without one, 1 for a WARN-or-worse finding
    about it and 0 when it was judged fine. `per` "node": one sample, deviceid ""."""

    health: str
    per: Literal["gpu", "peer", "node"] = "gpu"
    value: str | None = None


@dataclass(frozen=True)
class EventRun:
    """Events that run a check at once, besides its schedule: the agent follows
    `source` and runs the check (trigger `event`) as soon as it has something.

    - "nvml-xid": each XID event NVML delivers (a burst makes one run);
    - "kernel-log": a new kernel-log line of kind `lines` (checks.kernel_log), for
      what NVML has no event for.

    `listen`: the parameter saying how long one run waits for events, if any. A run
    an event triggers sets it to 0 (the event is already queued); the agent's
    periodic runs listen for `agent.xid_window_s` unless the config sets it (events
    stream in continuously anyway)."""

    source: Literal["nvml-xid", "kernel-log"]
    lines: Kind | None = None
    listen: str | None = None


class NoParams(BaseModel):
    """Parameters of a check that takes none."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass
class Peer:
    """Another node to probe: its name, its pod-network addresses (IPv4 and/or IPv6)
    and, per secondary network it is attached to, its addresses there. `blamed`: the
    networks (POD_NETWORK for the pod network) on which the fleet's blame says most
    of its own peers cannot reach it (healthd.blame), as the controller hands it on."""

    name: str
    addresses: Sequence[str]
    networks: Mapping[str, Sequence[str]] = field(default_factory=dict)
    blamed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Attachment:
    """One interface this node's own pod has on a secondary network (from Multus):
    what the `nic` check inspects."""

    network: str
    interface: str
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckContext:
    """What one run of a check gets from outside: that round's data, never a check's
    own stand-ins (those come at construction, see checks.probes). Frozen: whoever
    learns something new (a peer, the Node's GPU count) builds the next round's
    context, so a run in progress never sees its inputs change under it.

    `gpus` serves ONE NVML pass per round to every NVML check (see checks.snapshot);
    `expected_gpus` is how many the node should have (None: as many as NVML sees);
    `peers` are the nodes the ping check probes, `attachments` this pod's secondary
    interfaces (the nic and rdma checks); `namespace` is where the pvc probe works (the
    agent's probe namespace)."""

    catalog: Catalog
    node_name: str = ""
    gpus: GpuSource | None = None
    expected_gpus: int | None = None
    peers: Sequence[Peer] = ()
    attachments: Sequence[Attachment] = ()
    namespace: str = "healthd-system-probes"


def boot_uptime() -> float:
    """Seconds since the node booted (CLOCK_BOOTTIME: the host's, in a container too)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


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

    @property
    def labelled_level(self) -> int | None: ...

    async def run(self, ctx: CheckContext) -> CheckResult: ...


class BaseCheck:
    """The base of every check class: stores validated params; subclasses set the
    class attributes and implement `run`.

    - NAME: stable name used in config, CLI and labels (`remapped`, `dcgm`, ...)
    - Params: pydantic model of its parameters (`NoParams` when it has none)
    - ARG: the parameter that `name:value` on the command line sets (`dcgm:3`), if any
    - DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S: schedule defaults for the agent
    - EXCLUSIVE: needs all GPUs to itself (deep diagnostics)
    - MEASURES: the values its results carry that the agent exports as gauges
    - AUTOPILOT: its place in Autopilot's compatibility gauge, if Autopilot has it
    - COUNTS: the events its findings stand for, which the agent counts (`Counted`)
    - CODES: the finding codes it reports (see checks.catalog); a family of codes
      is written with a `*` (`XID_*`)
    - EVENTS: what runs it at once besides its schedule (`EventRun`), if anything
    - REACHABILITY: its results are the node's view of its peers, per network (the
      `ping` view of the health annotation the fleet's blame reads, and the
      per-network peer gauges); one check declares it
    - ENV: environment variables that set a parameter (`{variable: parameter}`):
      the config reads them, and the agent hands them on to its diagnostic Jobs

    - INPUTS: what it reads from the machine, by the names a recording
      (`healthd record`) gives its sources (`nvml`, `xid`, `pciebw`, `dcgm`, ...);
      None: one source named like the check. A replay runs it only when the
      recording holds every one (see `inputs_of`).

    Adding a check with a metric or an event source touches its module and its
    registry line: the agent builds its metric families, the Autopilot gauge and its
    event runs from these.
    """

    NAME: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    ARG: ClassVar[str | None] = None
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0
    EXCLUSIVE: ClassVar[bool] = False
    DESCRIPTION: ClassVar[str] = ""
    MEASURES: ClassVar[tuple[Measure, ...]] = ()
    AUTOPILOT: ClassVar[AutopilotGauge | None] = None
    COUNTS: ClassVar[tuple[Counted, ...]] = ()
    CODES: ClassVar[tuple[str, ...]] = ()
    INPUTS: ClassVar[frozenset[str] | None] = None
    EVENTS: ClassVar[EventRun | None] = None
    REACHABILITY: ClassVar[bool] = False
    ENV: ClassVar[Mapping[str, str]] = {}

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None, *,
                 probes: Probes | None = None) -> None:
        """`probes`: the stand-ins this check measures with (None: the real thing);
        each check reads only its own field of them."""
        self.probes = probes or Probes()
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

    @property
    def labelled_level(self) -> int | None:
        """The diagnostic level whose node label (`<prefix>dcgm.level.N`, Autopilot's)
        a deep run of this instance leaves; None: no label."""
        return None

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
        _log_fault(check.NAME, exc)
        result = CheckResult.unknown(check.NAME, f"check failed: {type(exc).__name__}: {exc}")
    return result.timed(started_wall, time.monotonic() - started)


_MAX_FAULTS = 1000  # distinct faults remembered: a bound, should a message vary a lot
_logged_faults: set[tuple[str, str, str, int]] = set()


def _log_fault(check: str, exc: Exception) -> None:
    """Log the traceback of a check's exception, once per distinct fault (see the
    module docstring); later runs with the same fault only make it UNKNOWN."""
    frames = traceback.extract_tb(exc.__traceback__)
    origin = (frames[-1].filename, frames[-1].lineno or 0) if frames else ("", 0)
    fault = (check, type(exc).__qualname__, *origin)
    if fault in _logged_faults:
        return
    if len(_logged_faults) < _MAX_FAULTS:
        _logged_faults.add(fault)
    log.error("check %s failed: %s: %s", check, type(exc).__name__, exc, exc_info=exc)
