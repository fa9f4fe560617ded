"""Every Prometheus metric the agent exports, on an explicit CollectorRegistry.

The agent feeds this module what happened (check results, the verdict state, the
publisher's health, fault-to-label latencies) and a scrape reads it back. Two kinds
of family, following client_python's advice for snapshots:

- counts and durations are plain Counter/Histogram objects, updated as results come;
- everything that describes *the latest result* of a check (status per entity,
  measured values, the Autopilot compatibility gauge, the verdict) is built at scrape
  time by healthd.agent.metric_families from the latest CheckResult of every check
  key. A GPU, peer or storage class absent from a check's latest result therefore
  has no series any more: nothing stale is left behind. A `kept` value (when pciebw
  last judged a GPU) is the one exception: the greatest any run gave is kept while the
  check's runs name the entity (healthd.agent.metric_families.kept_values).

Every healthd family carries a `node` label (dcgm-exporter calls it `Hostname`; we
use `node`, the name Kubernetes and kube-state-metrics use). GPU series carry
dcgm-exporter's labels so joins with it work: `gpu` (index), `UUID`, `pci_bus_id`,
`modelName` ("GPU labels" below). `check` is the check KEY (`remapped`, `dcgm:3`).

| family | type | labels | meaning |
| --- | --- | --- | --- |
| `autopilot_health_checks` | gauge | health, node, deviceid, cpumodel, gpumodel | Autopilot compatibility, same meaning: `pciebw` H2D GB/s per GPU index; `remapped`, `power-slowdown` 0/1 per GPU index; `dcgm`, `pvc` 0/1 with deviceid ""; `ping` 0/1 per peer node name (pod network). 1 = a WARN-or-worse finding (or a peer that lost every echo). No series while the check cannot tell |
| `healthd_check_status` | gauge (state set) | node, check, status | 1 for the status of the check's latest run, 0 for the other five statuses |
| `healthd_check_entity_status` | gauge | node, check, entity, GPU labels, status | one series per entity of the check's latest run, value 1, `status` its status (`entity` is `gpu3`, `node`, `peer/n2`, `peer/n2@net1`, `network/net1`, `nic/net1`, `storage/fast`; GPU labels empty for other entities) |
| `healthd_check_runs_total` | counter | node, check, result | completed runs by overall result (PASS WARN ERR EVICT UNKNOWN SKIPPED) |
| `healthd_check_duration_seconds` | histogram | node, check | how long runs took |
| `healthd_check_last_run_timestamp_seconds` | gauge | node, check | when the latest run ended (Unix time) |
| `healthd_check_interval_seconds` | gauge | node, check | the configured interval of each periodic check (none for cron-scheduled ones) |
| `healthd_node_verdict` | gauge (state set) | node, verdict | 1 for the current verdict, 0 for the others; absent before the agent's first state |
| `healthd_node_verdict_since_timestamp_seconds` | gauge | node | when the verdict last changed (Unix time) |
| `healthd_node_judged` | gauge | node | 1 once any check has given a judgement (before that the label is not written) |
| `healthd_node_held_findings` | gauge | node, severity | findings holding the verdict above PASS, by severity (WARN ERR EVICT) |
| `healthd_node_finding` | gauge | node, check, code, severity, entity | 1 per finding holding the verdict (what "top finding codes" panels count) |
| `healthd_node_flaps_total` | counter | node | findings that came back after one or more clean runs (each makes the finding's hold four times as long, up to the cap) |
| `healthd_gpu_pcie_bandwidth_gbps` | gauge | GPU labels, direction | measured copy bandwidth in GB/s, `h2d` / `d2h` (pciebw) |
| `healthd_gpu_pcie_link_bandwidth_gbps` | gauge | GPU labels | GB/s the current PCIe link can carry (pciebw) |
| `healthd_gpu_pcie_bandwidth_last_judged_timestamp_seconds` | gauge | GPU labels | when pciebw last judged a measurement of the GPU (Unix time); a busy GPU is not judged, so `time() - this` shows one not judged for a day; absent until this agent has judged the GPU; every kind of run keeps it (a run that does not judge the GPU, on-demand ones included, leaves the latest time), until pciebw's runs no longer name the GPU (pciebw) |
| `healthd_gpu_pcie_link_generation` | gauge | GPU labels, link | PCIe generation, `current` / `max` (pcie) |
| `healthd_gpu_pcie_link_width` | gauge | GPU labels, link | PCIe lanes, `current` / `max` (pcie) |
| `healthd_gpu_pcie_aer_errors` | gauge | GPU labels, kind, where | PCIe AER errors the kernel counted since boot, `kind` `correctable` / `nonfatal` / `fatal`, `where` `gpu` (the GPU's own function) or `upstream` (the bridges above it, summed) (aer) |
| `healthd_gpu_remapped_rows` | gauge | GPU labels, kind | rows remapped, `correctable` / `uncorrectable` (remapped) |
| `healthd_gpu_row_remap_pending` | gauge | GPU labels | 1 when a remap waits for a GPU reset (remapped) |
| `healthd_gpu_row_remap_failed` | gauge | GPU labels | 1 when a row remap failed (remapped) |
| `healthd_gpu_ecc_volatile_errors` | gauge | GPU labels, kind | ECC errors since the driver loaded, `corrected` / `uncorrected` (ecc) |
| `healthd_gpu_power_watts` | gauge | GPU labels | power draw (power) |
| `healthd_gpu_power_limit_watts` | gauge | GPU labels | enforced power limit (power) |
| `healthd_gpu_xid_events_total` | counter | GPU labels, xid | XID events received, by code (each XID finding adds its `count` value) |
| `healthd_nvswitch_sxid_events_total` | counter | node, nvswitch, sxid | NVSwitch SXID lines read from the kernel log, by code (sxid) |
| `healthd_kernel_log_skipped_lines_total` | counter | node, reason | kernel-log lines skipped as unusable, never judged: `not_utf8` (a record with bytes that are not UTF-8 in which no XID or SXID could be read; one whose XID or SXID is read is judged, not counted), `oversize` (past 8192 bytes), `not_a_record` (not `prio,seq,usec,flags;message`), `bad_xid` / `bad_sxid` (an XID or SXID line whose fields cannot be read: a driver that prints them differently); the agent logs the first of each reason |
| `healthd_gpu_fabric_registered` | gauge | GPU labels | 1 when the GPU is registered in its NVLink fabric (fabric) |
| `healthd_gpu_recovery_action` | gauge | GPU labels, action | the recovery action the driver asks for the GPU: NVML's number (0: none), `action` its name (`NONE`, `GPU_RESET`, `NODE_REBOOT`, ...; `UNKNOWN_<n>` for a newer one) (recovery) |
| `healthd_rdma_port_up` | gauge | node, port, network | 1 when the RDMA port is ACTIVE with its physical link up (rdma) |
| `healthd_rdma_port_rate_gbps` | gauge | node, port, network | the port's rate in Gb/s (rdma) |
| `healthd_rdma_port_errors` | gauge | node, port, network, counter | the port's error counters as sysfs shows them: `symbol_error`, `link_downed`, ... (rdma) |
| `healthd_peer_ping_loss_ratio` | gauge | node, peer | share of echoes lost on the peer's best address (ping) |
| `healthd_peer_ping_rtt_seconds` | gauge | node, peer, stat | round-trip time, `avg` / `max` (ping) |
| `healthd_network_peer_ping_loss_ratio` | gauge | node, peer, network | the same on a secondary network (`net1`, ...) |
| `healthd_network_peer_ping_rtt_seconds` | gauge | node, peer, network | average round-trip time on a secondary network |
| `healthd_ping_peers` | gauge | node, network | peers the latest ping round probed on the network (`pod` = the pod network) |
| `healthd_ping_unreachable_peers` | gauge | node, network | of those, the peers that did not answer |
| `healthd_storage_pvc_bind_seconds` | gauge | node, storage_class | seconds the test PVC took to bind (pvc) |
| `healthd_agent_fault_to_label_seconds` | histogram | node | from a fault's detection to the node label carrying it |
| `healthd_agent_api_in_sync` | gauge | node | 1 when the Node shows everything the agent wants it to |
| `healthd_agent_api_failing` | gauge | node | 1 when the latest write to the API server failed |
| `healthd_kube_undecodable_objects_total` | counter | node, kind | objects left out of what the agent watches because they are nested too deep to decode, by resource (`pods`, ...); each object counted and logged once (healthd.kube.decoding) |

Peers cost five series each on every node (status, loss, two RTTs, Autopilot's);
`AgentMetrics(peer_detail=False)` keeps only Autopilot's on very large fleets.
The XID counter keeps its series for the life of the process: a GPU that fell off
the bus (XID 79) may vanish from every later snapshot, and its count must not.
A scrape only reads; nothing here changes any state the agent acts on.
"""  # noqa: E501 (the table is meant to be copied as it is)

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

import checks
from checks import kernel_log
from checks.base import BaseCheck, CheckResult, Counted, Finding
from healthd.agent.metric_families import (
    ENTITY_LABELS,
    Kept,
    Latest,
    SkippedLinesCollector,
    Snapshot,
    SnapshotCollector,
    UndecodableCollector,
    check_name,
    entity_labels,
    kept_values,
    number,
)
from healthd.kube.decoding import UNDECODABLE, UndecodableObjects

if TYPE_CHECKING:
    from healthd.agent.verdict import HealthState

# From NVML checks (milliseconds) to a level-3 DCGM diagnostic (a quarter of an hour).
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# The goal is seconds from fault to label; the tail shows an API server that was away.
FAULT_TO_LABEL_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


def read_cpu_model(path: str = "/proc/cpuinfo") -> str:
    """The CPU's `model name` (Autopilot's `cpumodel` label); "" when unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == "model name":
                    return value.strip()
    except OSError:
        return ""
    return ""


class AgentMetrics:
    """Every agent metric, on an explicit CollectorRegistry (never the global REGISTRY).

    `gpu_model` "" means: the model of the lowest-numbered GPU any result names
    (Autopilot's `gpumodel`), "N/A" when none does. `peer_detail` False drops the
    per-peer healthd series (see metric_families.SnapshotCollector). `clock` dates
    results that carry no start time. `known` gives the check classes whose declared
    measures and Autopilot gauge are exported (None: the registry, `checks.REGISTRY`,
    as it is when the metrics are built)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        node: str,
        cpu_model: str = "",
        gpu_model: str = "",
        peer_detail: bool = True,
        skipped_lines: kernel_log.SkippedLines | None = None,
        undecodable: UndecodableObjects | None = None,
        clock: Callable[[], float] = time.time,
        known: Mapping[str, type[BaseCheck]] | None = None,
    ) -> None:
        self.node = node
        self._clock = clock
        self._lock = threading.Lock()  # a scrape may run in another thread than updates
        self._latest: dict[str, Latest] = {}
        self._kept: dict[str, Kept] = {}  # per check key: its `kept` measures' values
        self._seq = 0
        self._state: HealthState | None = None
        self._runs = Counter(
            "healthd_check_runs_total", "Check runs by overall result.",
            ["node", "check", "result"], registry=registry,
        )
        self._durations = Histogram(
            "healthd_check_duration_seconds", "Check run durations.",
            ["node", "check"], buckets=DURATION_BUCKETS, registry=registry,
        )
        known = checks.REGISTRY if known is None else known
        self._measures = {name: cls.MEASURES for name, cls in known.items()}
        self._counters = {name: [(c, _counter(c, registry)) for c in cls.COUNTS]
                          for name, cls in known.items() if cls.COUNTS}
        self._fault_to_label = Histogram(
            "healthd_agent_fault_to_label_seconds",
            "Seconds from a fault's detection to the node label carrying it.",
            ["node"], buckets=FAULT_TO_LABEL_BUCKETS, registry=registry,
        )
        self._in_sync = Gauge(
            "healthd_agent_api_in_sync", "1 when the Node shows everything the agent wants.",
            ["node"], registry=registry,
        )
        self._failing = Gauge(
            "healthd_agent_api_failing", "1 when the latest write to the API server failed.",
            ["node"], registry=registry,
        )
        self._intervals = Gauge(
            "healthd_check_interval_seconds", "Configured interval of each periodic check.",
            ["node", "check"], registry=registry,
        )
        collector = SnapshotCollector(
            self.snapshot, checks=known, node=node,
            cpu_model=cpu_model, gpu_model=gpu_model, peer_detail=peer_detail,
        )
        registry.register(collector)
        # This agent's kernel log's tally (the process's when none is given), read at
        # each scrape.
        lines = skipped_lines or kernel_log.SKIPPED
        registry.register(SkippedLinesCollector(lines.counts, node=node))
        # The client's tally of undecodable objects (the process's when none is given).
        tally = undecodable or UNDECODABLE
        registry.register(UndecodableCollector(tally.counts, node=node))

    def observe_result(self, key: str, result: CheckResult) -> None:
        """Count one completed run of check `key` (result, duration, XIDs) and make it
        the latest result of `key`, which scrapes describe."""
        ended = result.started_at + result.duration_s if result.started_at else self._clock()
        self._runs.labels(self.node, key, result.status.value).inc()
        self._durations.labels(self.node, key).observe(max(0.0, result.duration_s))
        for counted, counter in self._counters.get(result.check, ()):
            for finding in result.findings:
                _count(counter, counted, self.node, finding)
        measures = self._measures.get(check_name(key), ())
        with self._lock:
            self._seq += 1
            self._latest[key] = Latest(self._seq, result, ended)
            self._kept[key] = kept_values(self._kept.get(key, {}), result, measures)

    def observe_state(self, state: HealthState) -> None:
        """The node's verdict state, read back at scrape time."""
        with self._lock:
            self._state = state

    def observe_fault_to_label(self, seconds: float) -> None:
        self._fault_to_label.labels(self.node).observe(max(0.0, seconds))

    def set_intervals(self, intervals: Mapping[str, float]) -> None:
        """The periodic interval of each check key (cron-scheduled checks have none), so
        alerts can tell a check that stopped running from one that runs rarely."""
        for key, seconds in intervals.items():
            self._intervals.labels(self.node, key).set(seconds)

    def observe_publisher(self, in_sync: bool, last_error: str) -> None:
        self._in_sync.labels(self.node).set(1 if in_sync else 0)
        self._failing.labels(self.node).set(1 if last_error else 0)

    def snapshot(self) -> Snapshot:
        """What a scrape describes: the latest result per check key and the state."""
        with self._lock:
            return Snapshot(dict(self._latest), self._state, dict(self._kept))


def _counter(counted: Counted, registry: CollectorRegistry) -> Counter:
    """The counter of a check's declared events, labelled by entity and code."""
    return Counter(counted.family, counted.help,
                   ["node", *ENTITY_LABELS[counted.kind], counted.value], registry=registry)


def _count(counter: Counter, counted: Counted, node: str, finding: Finding) -> None:
    """Count the events `finding` stands for, if it is one of `counted`'s."""
    code, events = finding.values.get(counted.value), number(finding.values.get("count", 1))
    if finding.entity.kind != counted.kind or code is None or not events or events <= 0:
        return
    counter.labels(node, *entity_labels(finding.entity).values(), str(code)).inc(events)
