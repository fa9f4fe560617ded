"""The metric families that describe the latest result of every check, built at scrape time.

A scrape turns the latest CheckResult of every check key (plus the latest verdict
state) into gauge families: status per check and per entity, measured values
(each check class's `MEASURES`, one declarative row per value it records), the
Autopilot compatibility gauge (each class's `AUTOPILOT`), the node verdict. The check
classes come from the registry the collector is given, so a new check's values are
exported without a line here. Because nothing is kept between scrapes, a
GPU, peer or storage class missing from a check's latest result simply has no series
any more. The one exception is a `kept` measure (`Measure.kept`, when something last
happened): its greatest value per entity is kept across results (`kept_values`), for
as long as the check's results name the entity, so a run that could not tell (or a
check instance with no memory, as an on-demand run's) never erases it. The family
table is in healthd.agent.metrics, which owns the counters and feeds this collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from checks.base import (
    POD_NETWORK,
    AutopilotGauge,
    BaseCheck,
    CheckResult,
    Entity,
    EntityKind,
    Finding,
    Measure,
    Severity,
    Value,
)
from checks.kernel_log import Skip
from healthd.kube.conventions import Verdict

if TYPE_CHECKING:
    from healthd.agent.verdict import HealthState

GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "modelName")  # dcgm-exporter's names
ENTITY_LABELS: dict[EntityKind, tuple[str, ...]] = {
    "gpu": GPU_LABELS,
    "peer": ("peer",),
    "storage": ("storage_class",),
    "node": (),
    "network": ("network",),
    "nic": ("interface", "network"),
    "nvswitch": ("nvswitch",),
    "rdma": ("port", "network"),
}
AUTOPILOT_HELP = "Summary of the health checks measurements on compute nodes. Gauge Vector version"


@dataclass(frozen=True)
class Latest:
    """The latest result of one check key, as a scrape sees it."""

    seq: int  # observation order, so the newest of several keys (dcgm, dcgm:3) wins
    result: CheckResult
    ended_at: float


Slot = tuple[str, Entity]  # a `kept` value: (value key, entity)
Kept = Mapping[Slot, float]  # one check key's `kept` values: the greatest each was given


@dataclass(frozen=True)
class Snapshot:
    latest: Mapping[str, Latest]
    state: HealthState | None
    kept: Mapping[str, Kept] = field(default_factory=dict)  # per check key


def kept_values(before: Kept, result: CheckResult,
                measures: Iterable[Measure]) -> dict[Slot, float]:
    """The `kept` measures' values once `result` is in: the greatest each entity was
    ever given. An entity of a kind the result names others of, but not it, is gone
    (a GPU no longer on the node) and its values go; a result that names no entity of
    a kind (it could not tell at all) takes nothing away."""
    wanted = [m for m in measures if m.kept]
    named = {s.entity for s in result.entities}
    kinds = {e.kind for e in named}
    out = {(value, entity): v for (value, entity), v in before.items()
           if entity in named or entity.kind not in kinds}
    for status in result.entities:
        for m in wanted:
            given = number(status.values.get(m.value))
            if status.entity.kind == m.kind and given is not None:
                slot = (m.value, status.entity)
                out[slot] = max(out.get(slot, given), given)
    return out


def number(value: Value | None) -> float | None:
    """A measured value as a sample value; None for text and missing values."""
    if isinstance(value, bool | int | float):
        return float(value)
    return None


def gpu_labels(entity: Entity) -> dict[str, str]:
    """dcgm-exporter's labels for a GPU entity (all empty for other entities)."""
    if entity.kind != "gpu":
        return dict.fromkeys(GPU_LABELS, "")
    return {
        "gpu": entity.name,
        "UUID": entity.uuid,
        "pci_bus_id": entity.pci_bus_id,
        "modelName": entity.model,
    }


class _Families:
    """Gauge families assembled during one scrape; a repeated label set keeps the last
    value (two entities that map to the same labels must not yield duplicate series)."""

    def __init__(self) -> None:
        self._samples: dict[str, dict[tuple[str, ...], float]] = {}
        self._meta: dict[str, tuple[str, tuple[str, ...]]] = {}

    def add(self, family: str, help: str, labels: Mapping[str, str], value: float) -> None:
        self._meta.setdefault(family, (help, tuple(labels)))
        self._samples.setdefault(family, {})[tuple(labels.values())] = value

    def metrics(self) -> Iterator[Metric]:
        for family, samples in self._samples.items():
            help, names = self._meta[family]
            gauge = GaugeMetricFamily(family, help, labels=names)
            for values, value in samples.items():
                gauge.add_metric(values, value)
            yield gauge


class SnapshotCollector:
    """A prometheus_client collector: `read()` gives the latest results and state.

    `peer_detail` False leaves peers out of the per-entity and ping families (each
    peer costs every node five series: on a thousand-node fleet that is millions);
    the Autopilot gauge keeps its one series per peer either way."""

    def __init__(
        self,
        read: Callable[[], Snapshot],
        *,
        checks: Mapping[str, type[BaseCheck]],
        node: str,
        cpu_model: str,
        gpu_model: str,
        peer_detail: bool = True,
    ) -> None:
        self._read = read
        self._checks = dict(checks)  # check NAME -> its class: what it measures
        self._node = node
        self._cpu_model = cpu_model
        self._gpu_model = gpu_model
        self._peer_detail = peer_detail

    def describe(self) -> list[Metric]:
        return []  # the families vary with the results: nothing fixed to announce

    def collect(self) -> Iterator[Metric]:
        snap = self._read()
        out = _Families()
        identities = _gpu_identities(entry.result for entry in snap.latest.values())
        for key, entry in sorted(snap.latest.items()):
            self._check(out, key, entry)
            self._entities(out, key, entry.result, identities)
            self._kept(out, key, snap.kept.get(key, {}), identities)
        self._autopilot(out, snap.latest, identities)
        for key, entry in sorted(snap.latest.items()):
            if (declared := self._class_of(key)) is not None and declared.REACHABILITY:
                _ping_networks(out, self._node, entry.result)
        if snap.state is not None:
            self._verdict(out, snap.state)
        yield from out.metrics()
        if snap.state is not None:
            yield self._flaps(snap.state)

    def _class_of(self, key: str) -> type[BaseCheck] | None:
        """The class of check `key`: what it declares it measures and publishes."""
        return self._checks.get(check_name(key))

    def _flaps(self, state: HealthState) -> Metric:
        flaps = CounterMetricFamily(
            "healthd_node_flaps", "Findings raised again soon after their release (each "
            "makes the finding's hold four times as long, up to the cap).", labels=("node",))
        flaps.add_metric((self._node,), float(state.flaps_total))
        return flaps

    def _check(self, out: _Families, key: str, entry: Latest) -> None:
        base = {"node": self._node, "check": key}
        for status in Severity:
            out.add("healthd_check_status", "Status of the check's latest run (state set).",
                    {**base, "status": status.value},
                    1.0 if entry.result.status is status else 0.0)
        out.add("healthd_check_last_run_timestamp_seconds",
                "When the check's latest run ended (Unix time).", base, entry.ended_at)

    def _entities(
        self, out: _Families, key: str, result: CheckResult, identities: Mapping[str, Entity]
    ) -> None:
        declared = self._class_of(key)
        measures = declared.MEASURES if declared is not None else ()
        for status in result.entities:
            entity = _complete(status.entity, identities)
            if entity.kind == "peer" and not self._peer_detail:
                continue
            labels = {"node": self._node, "check": key, "entity": entity.label,
                      **gpu_labels(entity), "status": status.status.value}
            out.add("healthd_check_entity_status",
                    "Status of each entity in the check's latest run (value 1).", labels, 1.0)
            for measure in measures:
                if not measure.kept:  # those come from what is kept (`_kept`)
                    self._measure(out, measure, entity, status.values)

    def _kept(self, out: _Families, key: str, kept: Kept,
              identities: Mapping[str, Entity]) -> None:
        declared = self._class_of(key)
        for measure in declared.MEASURES if declared is not None else ():
            for (value, entity), given in sorted(kept.items()):
                if measure.kept and value == measure.value:
                    self._measure(out, measure, _complete(entity, identities), {value: given})

    def _measure(
        self, out: _Families, m: Measure, entity: Entity, values: Mapping[str, Value]
    ) -> None:
        value = number(values.get(m.value))
        peer_elsewhere = entity.kind == "peer" and bool(entity.network) != m.secondary
        texts = {label: values.get(key) for label, key in m.texts}
        if entity.kind != m.kind or value is None or peer_elsewhere or not all(
                isinstance(text, str) for text in texts.values()):
            return
        labels = {"node": self._node, **entity_labels(entity), **dict(m.extra),
                  **{label: str(text) for label, text in texts.items()}}
        if m.secondary:
            labels["network"] = entity.network
        out.add(m.family, m.help, labels, value * m.scale)

    def _autopilot(
        self, out: _Families, latest: Mapping[str, Latest], identities: Mapping[str, Entity]
    ) -> None:
        newest: dict[str, tuple[AutopilotGauge, Latest]] = {}
        for key, entry in latest.items():
            declared = self._class_of(key)
            gauge = declared.AUTOPILOT if declared is not None else None
            if gauge is None:
                continue
            if gauge.health not in newest or newest[gauge.health][1].seq < entry.seq:
                newest[gauge.health] = (gauge, entry)
        gpumodel = self._gpu_model or _first_model(identities) or "N/A"  # Autopilot's N/A
        for health, (gauge, entry) in sorted(newest.items()):
            for deviceid, value in _autopilot_values(gauge, entry.result):
                labels = {"health": health, "node": self._node, "deviceid": deviceid,
                          "cpumodel": self._cpu_model, "gpumodel": gpumodel}
                out.add("autopilot_health_checks", AUTOPILOT_HELP, labels, value)

    def _verdict(self, out: _Families, state: HealthState) -> None:
        node = {"node": self._node}
        for verdict in Verdict:
            out.add("healthd_node_verdict", "The node's verdict (state set).",
                    {**node, "verdict": verdict.value}, 1.0 if state.verdict is verdict else 0.0)
        out.add("healthd_node_verdict_since_timestamp_seconds",
                "When the node's verdict last changed (Unix time).", node, state.since)
        out.add("healthd_node_judged", "1 once any check has given a judgement.", node,
                1.0 if state.judged else 0.0)
        for severity in (Severity.WARN, Severity.ERR, Severity.EVICT):
            count = sum(1 for h in state.held if h.severity is severity)
            out.add("healthd_node_held_findings", "Findings holding the verdict, by severity.",
                    {**node, "severity": severity.value}, float(count))
        for held in state.held:
            out.add("healthd_node_finding", "A finding holding the verdict (value 1).",
                    {**node, "check": held.check, "code": held.code,
                     "severity": held.severity.value, "entity": held.entity}, 1.0)


class SkippedLinesCollector:
    """A prometheus_client collector: the kernel-log lines skipped as unusable, by
    reason (checks.kernel_log), as `read()` gives them at scrape time."""

    def __init__(self, read: Callable[[], Mapping[Skip, int]], *, node: str) -> None:
        self._read = read
        self._node = node

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        skipped = CounterMetricFamily(
            "healthd_kernel_log_skipped_lines", "Kernel-log lines skipped as unusable, by "
            "reason (the first of each reason is logged).", labels=("node", "reason"))
        for reason, count in sorted(self._read().items()):
            skipped.add_metric((self._node, reason), float(count))
        yield skipped


class UndecodableCollector:
    """A prometheus_client collector: the objects the agent's client left out as too
    deeply nested to decode, by resource (healthd.kube.decoding), read at scrape time."""

    def __init__(self, read: Callable[[], Mapping[str, int]], *, node: str) -> None:
        self._read = read
        self._node = node

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "healthd_kube_undecodable_objects", "Objects left out because they are "
            "nested too deep to decode, by resource.", labels=("node", "kind"))
        for kind, count in sorted(self._read().items()):
            family.add_metric((self._node, kind), float(count))
        yield family


def check_name(key: str) -> str:
    """The check NAME of a check KEY (`dcgm:3` -> `dcgm`)."""
    return key.partition(":")[0]


def entity_labels(entity: Entity) -> dict[str, str]:
    """An entity's labels, named as ENTITY_LABELS names them for its kind."""
    if entity.kind == "gpu":
        return gpu_labels(entity)
    if entity.kind == "nic":
        return {"interface": entity.name, "network": entity.network}
    if entity.kind == "rdma":
        return {"port": entity.name, "network": entity.network}
    return {name: entity.name for name in ENTITY_LABELS[entity.kind]}


def _ping_networks(out: _Families, node: str, result: CheckResult) -> None:
    """Per network this node probed (the latest result of the check declaring
    REACHABILITY): peers probed and peers that lost every echo (or were found
    unreachable): the per-network view a dashboard plots."""
    probed: dict[str, int] = {}
    unreachable: dict[str, int] = {}
    for status in result.entities:
        entity = status.entity
        if entity.kind != "peer":
            continue
        network = entity.network or POD_NETWORK
        probed[network] = probed.get(network, 0) + 1
        flag = _entity_flag(entity, status.status, status.values, result.findings)
        unreachable[network] = unreachable.get(network, 0) + (flag == 1.0)
    for network in sorted(probed):
        labels = {"node": node, "network": network}
        out.add("healthd_ping_peers", "Peers the latest ping round probed, per network.",
                labels, float(probed[network]))
        out.add("healthd_ping_unreachable_peers",
                "Peers that did not answer in the latest ping round, per network.",
                labels, float(unreachable[network]))


def _gpu_identities(results: Iterable[CheckResult]) -> dict[str, Entity]:
    """GPU index -> the fullest identity any result gives it (DCGM names GPUs by index
    only; the NVML checks know their UUID, bus id and model)."""
    known: dict[str, Entity] = {}
    for result in results:
        for status in result.entities:
            entity = status.entity
            if entity.kind == "gpu" and entity.uuid and entity.name not in known:
                known[entity.name] = entity
    return known


def _complete(entity: Entity, identities: Mapping[str, Entity]) -> Entity:
    if entity.kind == "gpu" and not entity.uuid and entity.name in identities:
        return identities[entity.name]
    return entity


def _first_model(identities: Mapping[str, Entity]) -> str:
    ordered = sorted(identities.values(), key=lambda e: e.index or 0)
    return next((e.model for e in ordered if e.model), "")


def _failing(findings: Iterable[Finding]) -> bool:
    """Autopilot's 1: something at WARN or worse was found."""
    return any(f.severity.rank >= Severity.WARN.rank for f in findings)


def _autopilot_values(gauge: AutopilotGauge, result: CheckResult) -> list[tuple[str, float]]:
    """(deviceid, value) pairs with Autopilot's meaning for one check's latest result
    (see checks.base.AutopilotGauge)."""
    if gauge.per == "node":
        if _failing(result.findings):
            return [("", 1.0)]
        return [("", 0.0)] if result.status.ordered else []
    out: list[tuple[str, float]] = []
    for status in result.entities:
        # Autopilot's deviceid is the GPU index or the peer's name: the pod network's view.
        if status.entity.kind != gauge.per or status.entity.network:
            continue
        if gauge.value is not None:
            value = number(status.values.get(gauge.value))
        else:
            value = _entity_flag(status.entity, status.status, status.values, result.findings)
        if value is not None:
            out.append((status.entity.name, value))
    return out


def _entity_flag(
    entity: Entity, status: Severity, values: Mapping[str, Value], findings: Iterable[Finding]
) -> float | None:
    """1 when the entity has a WARN-or-worse finding, 0 when it was judged fine, None
    when the check could not tell. A peer not judged because this node is isolated
    still counts as unreachable when every echo was lost (Autopilot's 100% loss)."""
    if _failing(f for f in findings if f.entity == entity):
        return 1.0
    if status.ordered:
        return 0.0
    loss = number(values.get("loss"))
    if entity.kind == "peer" and loss is not None and loss >= 1.0:
        return 1.0
    return None
