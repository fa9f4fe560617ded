"""Every Prometheus metric the controller exports, on an explicit CollectorRegistry.

The controller's activities (resets, lending, the breaker, the caches, the Lease)
report what they decided here; a scrape reads it back. Nothing here changes any
state the controller acts on.

| family | type | labels | meaning |
| --- | --- | --- | --- |
| `healthd_controller_resets_total` | counter | result | reset decisions by outcome: `reset`, `dry-run`, `breaker-open`, `spacing`, `rate-limited`, `conflict-retry`, `gone`, `error` (healthd.controller.appwrappers) |
| `healthd_controller_lending_writes_total` | counter | queue, result | lendingLimit writes: `written`, `dry-run`, `conflict`, `rejected`, `error` |
| `healthd_controller_lending_limit` | gauge | queue, flavor, resource | the lendingLimit the queue should carry; no series while the field is absent (everything lendable) |
| `healthd_controller_nominal_quota` | gauge | queue, flavor, resource | the nominalQuota the limit was computed from |
| `healthd_controller_unavailable` | gauge | queue, flavor, resource, reason | capacity on bad nodes that match the flavor, by reason (`EVICT`, `ERR`, `TESTING`, `NotReady`, `Unreachable`, `Cordoned`) |
| `healthd_controller_shortfall` | gauge | queue, flavor, resource | unavailable capacity beyond nominalQuota (the limit is clamped at 0) |
| `healthd_controller_breaker_open` | gauge | | 1 while the circuit breaker stops resets |
| `healthd_controller_bad_nodes` | gauge | | GPU nodes the breaker counts as bad (a bad verdict, NotReady or unreachable; a cordon alone is not) |
| `healthd_controller_label_to_reset_seconds` | histogram | | from the watch event that made a node EVICT to the reset written |
| `healthd_controller_repairs_total` | counter | action, outcome | repair steps: action `reset` (a GPU reset), `reboot` (a reboot request), `validate` (a new node's validation), `hardware-inspection`, `wait`, `held`; outcome `started`, `passed`, `failed`, `timed-out` (no reboot came, a reset past its bound), `refused` (a reset something still holding the GPUs kept from running), `dry-run` (healthd.controller.repairs) |
| `healthd_controller_fault_to_pass_seconds` | histogram | | from a repaired node's first held finding to its validation passed |
| `healthd_controller_nodes_in_hardware_inspection` | gauge | | GPU nodes whose repair is handed to humans (until an admin clears them) |
| `healthd_controller_repair_records_refused_total` | counter | | `healthd.io/repair` records the controller refused as not its own (unreadable, a state, Job, GPU or time its history does not give), each replaced by an idle one with a `RepairRecordRefused` Warning Event |
| `healthd_controller_repair_nodes` | gauge | state | GPU nodes per repair state (`waiting`, `held`, `resetting`, `validating`, `reboot-requested`, `hardware-inspection`), every state shown, 0 included |
| `healthd_controller_repair_state_since_timestamp_seconds` | gauge | node, state | when a node in a repair entered its state (Unix time); no series for an idle node: `time() - ` it is how long a repair has been stuck |
| `healthd_controller_cache_synced` | gauge | kind | 1 once the cache of `kind` (`nodes`, `pods`, `appwrappers`, `clusterqueues`, `resourceflavors`) has its first full list; 0 while not leading |
| `healthd_controller_leader` | gauge | | 1 while this replica holds the Lease |
| `healthd_kube_undecodable_objects_total` | counter | kind | objects left out of what the controller sees because they are nested too deep to decode (an AppWrapper's free-form template, say), by resource (`appwrappers`, ...); each object counted and logged once (healthd.kube.decoding) |
| `healthd_network_blamed` | gauge | node, network | 1 while most of its peers cannot reach the node by ping on that network (`pod` or a secondary network's name; healthd.blame.announce); no series otherwise |
| `healthd_network_partitioned` | gauge | network | 1 while pings on that network fail between groups of nodes or most nodes reach almost nobody (nobody is blamed for those) |

Quantities are exported as plain numbers (`500m` is 0.5, `2000G` is 2e12).
"""  # noqa: E501 (the table is meant to be copied as it is)

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from healthd.kube.decoding import UNDECODABLE, UndecodableObjects

# A reset is meant to follow a label change within a second; the tail shows a
# breaker, a rate limit or an API server that was away.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
# A GPU reset and its validation take minutes; a repair waiting for work to leave, hours.
REPAIR_BUCKETS = (30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400)
_QUEUE_LABELS = ("queue", "flavor", "resource")
# The repair states a node can be in besides idle (healthd.controller.repair_state).
REPAIR_GAUGE_STATES = ("waiting", "held", "resetting", "validating", "reboot-requested",
                       "hardware-inspection")


class ControllerMetrics:
    """The controller's metric families, registered on `registry`.

    The families are public attributes for callers that need the full
    prometheus_client surface; the methods cover what the controller records.
    """

    def __init__(self, registry: CollectorRegistry,
                 undecodable: UndecodableObjects | None = None) -> None:
        self.registry = registry
        self._reasons: dict[tuple[str, ...], set[str]] = {}  # lending series -> reasons shown
        self.resets = Counter(
            "healthd_controller_resets", "AppWrapper reset decisions by outcome",
            ["result"], registry=registry)
        self.lending_writes = Counter(
            "healthd_controller_lending_writes", "slack queue lendingLimit writes by outcome",
            ["queue", "result"], registry=registry)
        self.lending_limit = Gauge(
            "healthd_controller_lending_limit", "lendingLimit the slack queue should carry",
            _QUEUE_LABELS, registry=registry)
        self.nominal_quota = Gauge(
            "healthd_controller_nominal_quota", "nominalQuota of the slack queue's resource",
            _QUEUE_LABELS, registry=registry)
        self.unavailable = Gauge(
            "healthd_controller_unavailable", "capacity on bad nodes matching the flavor",
            [*_QUEUE_LABELS, "reason"], registry=registry)
        self.shortfall = Gauge(
            "healthd_controller_shortfall", "unavailable capacity beyond nominalQuota",
            _QUEUE_LABELS, registry=registry)
        self.breaker_open = Gauge(
            "healthd_controller_breaker_open", "1 while the circuit breaker stops resets",
            registry=registry)
        self.bad_nodes = Gauge(
            "healthd_controller_bad_nodes", "GPU nodes the circuit breaker counts as bad",
            registry=registry)
        self.label_to_reset = Histogram(
            "healthd_controller_label_to_reset_seconds",
            "from the node watch event to the AppWrapper reset written",
            buckets=LATENCY_BUCKETS, registry=registry)
        self.repairs = Counter(
            "healthd_controller_repairs", "repair steps by action and outcome",
            ["action", "outcome"], registry=registry)
        self.fault_to_pass = Histogram(
            "healthd_controller_fault_to_pass_seconds",
            "from a repaired node's first held finding to its validation passed",
            buckets=REPAIR_BUCKETS, registry=registry)
        self.in_inspection = Gauge(
            "healthd_controller_nodes_in_hardware_inspection",
            "GPU nodes whose repair is handed to humans", registry=registry)
        self.refused_records = Counter(
            "healthd_controller_repair_records_refused",
            "repair records on Nodes the controller refused as not its own",
            registry=registry)
        self.repair_nodes = Gauge(
            "healthd_controller_repair_nodes", "GPU nodes per repair state", ["state"],
            registry=registry)
        self.repair_since = Gauge(
            "healthd_controller_repair_state_since_timestamp_seconds",
            "when a node in a repair entered its state", ["node", "state"], registry=registry)
        self._repair_states: dict[str, tuple[str, float]] = {}  # node -> (state, since)
        for state in REPAIR_GAUGE_STATES:
            self.repair_nodes.labels(state=state)  # visible at 0 before the first repair
        self.cache_synced = Gauge(
            "healthd_controller_cache_synced", "1 once the cache has its first full list",
            ["kind"], registry=registry)
        self.leader = Gauge(
            "healthd_controller_leader", "1 while this replica holds the Lease",
            registry=registry)
        self.network_blamed = Gauge(
            "healthd_network_blamed",
            "1 while most of its peers cannot reach the node on the network",
            ["node", "network"], registry=registry)
        self.network_partitioned = Gauge(
            "healthd_network_partitioned",
            "1 while pings on the network fail between groups of nodes",
            ["network"], registry=registry)
        self._blamed: set[tuple[str, str]] = set()
        self._partitioned: set[str] = set()
        for result in ("reset", "dry-run", "breaker-open", "error"):
            self.resets.labels(result=result)  # visible at 0 before the first decision
        # The client's tally (the process's when none is given), read at each scrape.
        registry.register(UndecodableCollector(undecodable or UNDECODABLE))

    # -- resets --------------------------------------------------------------------

    def count_reset(self, result: str) -> None:
        self.resets.labels(result=result).inc()

    def observe_latency(self, seconds: float) -> None:
        """Label-change-to-reset latency of one reset (negative clock steps read 0)."""
        self.label_to_reset.observe(max(0.0, seconds))

    def set_breaker(self, is_open: bool, bad_nodes: int | None = None) -> None:
        self.breaker_open.set(1 if is_open else 0)
        if bad_nodes is not None:
            self.bad_nodes.set(bad_nodes)

    # -- repairs -------------------------------------------------------------------

    def count_repair(self, action: str, outcome: str) -> None:
        self.repairs.labels(action=action, outcome=outcome).inc()

    def observe_fault_to_pass(self, seconds: float) -> None:
        self.fault_to_pass.observe(max(0.0, seconds))

    def set_in_inspection(self, nodes: int) -> None:
        self.in_inspection.set(nodes)

    def count_refused_record(self) -> None:
        self.refused_records.inc()

    def set_repair_state(self, node: str, state: str, since: float | None) -> None:
        """Node `node`'s repair is in `state` since `since` ("" : idle, or gone)."""
        old = self._repair_states.pop(node, None)
        if old is not None:
            _remove(self.repair_since, {"node": node, "state": old[0]})
        if state:
            self._repair_states[node] = (state, since or 0.0)
            self.repair_since.labels(node=node, state=state).set(since or 0.0)
        counts = collections.Counter(s for s, _ in self._repair_states.values())
        for name in REPAIR_GAUGE_STATES:
            self.repair_nodes.labels(state=name).set(counts.get(name, 0))

    # -- lending -------------------------------------------------------------------

    def count_lending_write(self, queue: str, result: str) -> None:
        self.lending_writes.labels(queue=queue, result=result).inc()

    def set_lending(self, queue: str, flavor: str, resource: str, *,
                    limit: Decimal | None, nominal: Decimal, shortfall: Decimal,
                    unavailable: Mapping[str, Decimal] | None = None) -> None:
        """The state of one (queue, flavor, resource): `limit` None removes its series
        (the field is absent); `unavailable` by reason replaces the previous reasons."""
        labels = {"queue": queue, "flavor": flavor, "resource": resource}
        self._reasons.setdefault(_key(labels), set())
        if limit is None:
            _remove(self.lending_limit, labels)
        else:
            self.lending_limit.labels(**labels).set(float(limit))
        self.nominal_quota.labels(**labels).set(float(nominal))
        self.shortfall.labels(**labels).set(float(max(Decimal(0), shortfall)))
        if unavailable is not None:
            self._set_unavailable(labels, unavailable)

    def _set_unavailable(self, labels: Mapping[str, str],
                         by_reason: Mapping[str, Decimal]) -> None:
        key = _key(labels)
        for reason in self._reasons.get(key, set()) - set(by_reason):
            _remove(self.unavailable, {**labels, "reason": reason})
        for reason, amount in by_reason.items():
            self.unavailable.labels(**labels, reason=reason).set(float(amount))
        self._reasons[key] = set(by_reason)

    def forget_queue(self, queue: str) -> None:
        """Drop every lending series of a queue that is gone."""
        for key in [k for k in self._reasons if k[0] == queue]:
            labels = dict(zip(_QUEUE_LABELS, key, strict=True))
            for family in (self.lending_limit, self.nominal_quota, self.shortfall):
                _remove(family, labels)
            for reason in self._reasons.pop(key):
                _remove(self.unavailable, {**labels, "reason": reason})

    # -- network blame ---------------------------------------------------------------

    def set_blamed(self, blamed: Iterable[tuple[str, str]]) -> None:
        """Exactly these (node, network) pairs are blamed now: their series read 1,
        the others go."""
        now = set(blamed)
        for node, network in self._blamed - now:
            with contextlib.suppress(KeyError):
                self.network_blamed.remove(node, network)
        for node, network in now:
            self.network_blamed.labels(node=node, network=network).set(1)
        self._blamed = now

    def set_partitioned(self, networks: Mapping[str, bool]) -> None:
        """Each judged network's partition flag; networks no longer judged go."""
        for gone in self._partitioned - networks.keys():
            with contextlib.suppress(KeyError):
                self.network_partitioned.remove(gone)
        for network, partitioned in networks.items():
            self.network_partitioned.labels(network=network).set(1 if partitioned else 0)
        self._partitioned = set(networks)

    # -- caches and leadership ------------------------------------------------------

    def set_synced(self, kind: str, synced: bool = True) -> None:
        self.cache_synced.labels(kind=kind).set(1 if synced else 0)

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)


def _key(labels: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(labels[name] for name in _QUEUE_LABELS)


def _remove(family: Gauge, labels: Mapping[str, str]) -> None:
    names = (*_QUEUE_LABELS, "reason") if "reason" in labels else _QUEUE_LABELS
    with contextlib.suppress(KeyError):  # no such series: nothing to remove
        family.remove(*(labels[name] for name in names))


class UndecodableCollector:
    """A prometheus_client collector: the objects the client left out as too deeply
    nested to decode, by resource, as the tally holds them at scrape time."""

    def __init__(self, tally: UndecodableObjects) -> None:
        self._tally = tally

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "healthd_kube_undecodable_objects", "Objects left out because they are "
            "nested too deep to decode, by resource.", labels=("kind",))
        for kind, count in sorted(self._tally.counts().items()):
            family.add_metric((kind,), float(count))
        yield family
