"""AgentMetrics: what a scrape shows after the agent feeds it check results and states.

Per-GPU status with dcgm-exporter's labels, the Autopilot compatibility gauge
(pciebw GB/s, remapped 0/1, dcgm/pvc per node, ping per peer), measured values,
counters and histograms, the verdict state set, and series that disappear with the
GPU or peer they describe."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from checks.base import CheckResult, Entity
from checks.snapshot import XidEvent
from checks.xid import findings_for_xids
from healthd.agent import verdict
from healthd.agent.metrics import AgentMetrics, read_cpu_model
from healthd.agent.verdict import Policy, Trigger
from healthd.kube.conventions import Verdict
from tests.agent_metrics.conftest import (
    MODEL,
    NODE,
    builder,
    gpu,
    gpu_labels,
    pciebw,
    remapped,
    stamped,
)


def autopilot(registry: CollectorRegistry, health: str, deviceid: str) -> float | None:
    labels = {"health": health, "node": NODE, "deviceid": deviceid,
              "cpumodel": "AMD EPYC 9654", "gpumodel": MODEL}
    return registry.get_sample_value("autopilot_health_checks", labels)


def entity_status(registry: CollectorRegistry, check: str, index: int, status: str) -> float | None:
    labels = {**gpu_labels(index), "check": check, "entity": f"gpu{index}", "status": status}
    return registry.get_sample_value("healthd_check_entity_status", labels)


def test_status_per_gpu_carries_dcgm_exporter_labels(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe_result("remapped", remapped(range(4), pending=(2,)))
    assert entity_status(registry, "remapped", 2, "ERR") == 1
    assert entity_status(registry, "remapped", 2, "PASS") is None
    assert entity_status(registry, "remapped", 1, "PASS") == 1
    check = {"node": NODE, "check": "remapped"}
    assert registry.get_sample_value("healthd_check_status", {**check, "status": "ERR"}) == 1
    assert registry.get_sample_value("healthd_check_status", {**check, "status": "PASS"}) == 0


def test_autopilot_gauge_keeps_autopilots_meaning(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe_result("pciebw", pciebw({0: 24.5, 1: 3.1}, low=(1,)))
    metrics.observe_result("remapped", remapped(range(2), pending=(1,)))
    assert autopilot(registry, "pciebw", "0") == 24.5  # GB/s host-to-device, per GPU index
    assert autopilot(registry, "pciebw", "1") == 3.1
    assert autopilot(registry, "remapped", "0") == 0
    assert autopilot(registry, "remapped", "1") == 1


def test_autopilot_gauge_node_wide_checks_and_peers(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    dcgm = builder("dcgm")
    dcgm.seen(Entity.gpu(0))  # DCGM names GPUs by index only
    dcgm.finding("DCGM_MEMORY", Entity.gpu(0), "memory test failed")
    metrics.observe_result("dcgm:3", stamped(dcgm.build()))
    ping = builder("ping")
    ping.seen(Entity("peer", "n2"), loss=0.0, rtt_avg_ms=0.4, rtt_max_ms=0.9)
    ping.finding("PEER_UNREACHABLE", Entity("peer", "n3"), "no answer", loss=1.0)
    metrics.observe_result("ping", stamped(ping.build()))
    assert autopilot(registry, "dcgm", "") == 1
    assert autopilot(registry, "ping", "n2") == 0
    assert autopilot(registry, "ping", "n3") == 1
    peer = {"node": NODE, "peer": "n2"}
    rtt = registry.get_sample_value("healthd_peer_ping_rtt_seconds", {**peer, "stat": "max"})
    assert rtt is not None and abs(rtt - 0.0009) < 1e-12
    # The DCGM GPU borrows the identity the NVML checks know, so joins work.
    metrics.observe_result("remapped", remapped(range(1)))
    assert entity_status(registry, "dcgm:3", 0, "EVICT") == 1


def test_isolated_node_reports_peers_that_lost_every_echo(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    ping = builder("ping")
    ping.seen(Entity("peer", "n2"), loss=1.0)
    ping.unknown(Entity("peer", "n2"), "not judged: this node cannot reach most of its peers")
    ping.seen(Entity("peer", "n3"), loss=0.5)
    ping.unknown(Entity("peer", "n3"), "not judged: this node cannot reach most of its peers")
    metrics.observe_result("ping", stamped(ping.build()))
    assert autopilot(registry, "ping", "n2") == 1
    assert autopilot(registry, "ping", "n3") is None  # could not tell: no series


def test_check_that_cannot_tell_has_no_autopilot_series(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe_result("remapped", remapped(range(2)))
    metrics.observe_result("remapped", stamped(CheckResult.unknown("remapped", "no driver")))
    assert autopilot(registry, "remapped", "0") is None
    check = {"node": NODE, "check": "remapped"}
    assert registry.get_sample_value("healthd_check_status", {**check, "status": "UNKNOWN"}) == 1


def test_gpu_that_disappears_loses_its_series(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe_result("pciebw", pciebw({0: 24.5, 1: 25.0, 2: 24.9}))
    bw = {**gpu_labels(2), "direction": "h2d"}
    assert registry.get_sample_value("healthd_gpu_pcie_bandwidth_gbps", bw) == 24.9
    metrics.observe_result("pciebw", pciebw({0: 24.5, 1: 25.0}))
    assert registry.get_sample_value("healthd_gpu_pcie_bandwidth_gbps", bw) is None
    assert entity_status(registry, "pciebw", 2, "PASS") is None
    assert autopilot(registry, "pciebw", "2") is None
    assert autopilot(registry, "pciebw", "1") == 25.0


def judged(times: dict[int, float | None]) -> CheckResult:
    """pciebw's result with each GPU's `last_judged` (None: the run's check has none:
    busy since it started, an on-demand run's fresh check)."""
    b = builder("pciebw")
    for index, when in times.items():
        b.seen(gpu(index), **({"last_judged": when} if when is not None else {}))
    return stamped(b.build())


def test_when_a_gpu_was_last_judged_is_kept_while_the_gpu_is_there(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    family = "healthd_gpu_pcie_bandwidth_last_judged_timestamp_seconds"
    metrics.observe_result("pciebw", judged({0: 100.0, 1: 200.0, 2: 300.0}))
    metrics.observe_result("pciebw", judged({0: None, 1: 150.0, 2: 300.0}))
    assert registry.get_sample_value(family, gpu_labels(0)) == 100  # not given: kept
    assert registry.get_sample_value(family, gpu_labels(1)) == 200  # never moves back
    metrics.observe_result("pciebw", stamped(CheckResult.unknown("pciebw", "no driver")))
    assert registry.get_sample_value(family, gpu_labels(2)) == 300  # could not tell
    metrics.observe_result("pciebw", judged({0: None, 1: None}))
    assert registry.get_sample_value(family, gpu_labels(2)) is None  # GPU 2 is gone
    assert registry.get_sample_value(family, gpu_labels(0)) == 100


def test_peer_that_disappears_loses_its_series(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    for peers in (("n2", "n3"), ("n2",)):
        ping = builder("ping")
        for name in peers:
            ping.seen(Entity("peer", name), loss=0.0)
        metrics.observe_result("ping", stamped(ping.build()))
    loss = "healthd_peer_ping_loss_ratio"
    assert registry.get_sample_value(loss, {"node": NODE, "peer": "n2"}) == 0
    assert registry.get_sample_value(loss, {"node": NODE, "peer": "n3"}) is None
    assert autopilot(registry, "ping", "n3") is None


def test_measured_values(metrics: AgentMetrics, registry: CollectorRegistry) -> None:
    metrics.observe_result("remapped", remapped(range(2), pending=(1,)))
    metrics.observe_result("pciebw", pciebw({0: 24.5}))
    rows = {**gpu_labels(1), "kind": "uncorrectable"}
    assert registry.get_sample_value("healthd_gpu_remapped_rows", rows) == 1
    assert registry.get_sample_value("healthd_gpu_row_remap_pending", gpu_labels(1)) == 1
    assert registry.get_sample_value("healthd_gpu_row_remap_pending", gpu_labels(0)) == 0
    d2h = {**gpu_labels(0), "direction": "d2h"}
    assert registry.get_sample_value("healthd_gpu_pcie_bandwidth_gbps", d2h) == 25.5


def test_runs_durations_and_last_run(metrics: AgentMetrics, registry: CollectorRegistry) -> None:
    metrics.observe_result("remapped", remapped(range(2)))
    metrics.observe_result("remapped", remapped(range(2), pending=(0,)))
    metrics.observe_result("remapped", stamped(CheckResult.unknown("remapped", "timed out"), 0))
    runs = {"node": NODE, "check": "remapped"}
    get = registry.get_sample_value
    assert get("healthd_check_runs_total", {**runs, "result": "PASS"}) == 1
    assert get("healthd_check_runs_total", {**runs, "result": "ERR"}) == 1
    assert get("healthd_check_runs_total", {**runs, "result": "UNKNOWN"}) == 1
    assert get("healthd_check_duration_seconds_count", runs) == 3
    assert get("healthd_check_duration_seconds_bucket", {**runs, "le": "0.25"}) == 3
    # The last result carried no start time: the clock dates it.
    assert get("healthd_check_last_run_timestamp_seconds", runs) == 5000.0
    metrics.observe_result("remapped", remapped(range(2)))
    assert get("healthd_check_last_run_timestamp_seconds", runs) == 1000.2


def test_xid_events_counted_by_code(metrics: AgentMetrics, registry: CollectorRegistry) -> None:
    b = builder("xid")
    events = [XidEvent(79, 3, "GPU-0003", 1.0), XidEvent(79, 3, "GPU-0003", 2.0)]
    findings_for_xids(events, [], b)
    metrics.observe_result("xid", stamped(b.build()))
    b = builder("xid")
    findings_for_xids([XidEvent(79, 3, "GPU-0003", 3.0), XidEvent(13, 3, "GPU-0003", 3.0)], [], b)
    metrics.observe_result("xid", stamped(b.build()))
    labels = {"node": NODE, "gpu": "3", "UUID": "GPU-0003", "pci_bus_id": "", "modelName": ""}
    get = registry.get_sample_value
    assert get("healthd_gpu_xid_events_total", {**labels, "xid": "79"}) == 3
    assert get("healthd_gpu_xid_events_total", {**labels, "xid": "13"}) == 1


def test_sxids_fabric_and_rdma_ports(metrics: AgentMetrics, registry: CollectorRegistry) -> None:
    b = builder("sxid")
    b.finding("SXID_12020", Entity("nvswitch", "nvswitch2"), "fatal", sxid=12020, count=2)
    metrics.observe_result("sxid", stamped(b.build()))
    b = builder("fabric")
    b.seen(Entity.gpu(0, "GPU-0000"), fabric_registered=0, fabric_state="not_started")
    metrics.observe_result("fabric", stamped(b.build()))
    b = builder("rdma")
    port = Entity("rdma", "mlx5_0/1", network="net1")
    b.seen(port, up=0, rate_gbps=400.0, symbol_error=7, state="DOWN")
    metrics.observe_result("rdma", stamped(b.build()))
    get = registry.get_sample_value
    assert get("healthd_nvswitch_sxid_events_total",
               {"node": NODE, "nvswitch": "nvswitch2", "sxid": "12020"}) == 2
    assert get("healthd_gpu_fabric_registered",
               {"node": NODE, "gpu": "0", "UUID": "GPU-0000", "pci_bus_id": "",
                "modelName": ""}) == 0
    where = {"node": NODE, "port": "mlx5_0/1", "network": "net1"}
    assert get("healthd_rdma_port_up", where) == 0
    assert get("healthd_rdma_port_rate_gbps", where) == 400
    assert get("healthd_rdma_port_errors", {**where, "counter": "symbol_error"}) == 7


def test_verdict_state_set(metrics: AgentMetrics, registry: CollectorRegistry) -> None:
    before = registry.get_sample_value("healthd_node_verdict", {"node": NODE, "verdict": "PASS"})
    assert before is None  # no state yet: no claim about the verdict
    state = verdict.initial(at=10.0)
    for at in (15.0, 20.0):  # a pending row raises at once; the second sighting keeps it
        state = verdict.apply(state, "remapped", remapped(range(4), pending=(3,)),
                              trigger=Trigger.PERIODIC, at=at, policy=Policy())
    metrics.observe_state(state)
    for value in Verdict:
        sample = registry.get_sample_value("healthd_node_verdict", {"node": NODE, "verdict": value})
        assert sample == (1 if value is Verdict.ERR else 0), value
    node = {"node": NODE}
    assert registry.get_sample_value("healthd_node_verdict_since_timestamp_seconds", node) == 15
    assert registry.get_sample_value("healthd_node_judged", node) == 1
    held = {**node, "severity": "ERR"}
    assert registry.get_sample_value("healthd_node_held_findings", held) == 1


def test_flaps_count_findings_that_come_back_soon_after_release(
        metrics: AgentMetrics, registry: CollectorRegistry) -> None:
    state, at = verdict.initial(at=0.0), 0.0
    faulty, clean = remapped(range(4), pending=(3,)), remapped(range(4))
    for rounds in ([faulty] * 2, [clean] * 2, [faulty] * 2, [clean] * 4, [faulty] * 2):
        for result in rounds:
            at += 1.0
            state = verdict.apply(state, "remapped", result, trigger=Trigger.PERIODIC, at=at,
                                  policy=Policy())
        metrics.observe_state(state)
    assert registry.get_sample_value("healthd_node_flaps_total", {"node": NODE}) == 2


def test_fault_to_label_and_publisher(metrics: AgentMetrics, registry: CollectorRegistry) -> None:
    metrics.observe_fault_to_label(0.8)
    metrics.observe_fault_to_label(45.0)
    node = {"node": NODE}
    get = registry.get_sample_value
    assert get("healthd_agent_fault_to_label_seconds_count", node) == 2
    assert get("healthd_agent_fault_to_label_seconds_bucket", {**node, "le": "1.0"}) == 1
    metrics.observe_publisher(False, "connection refused")
    assert get("healthd_agent_api_in_sync", node) == 0
    assert get("healthd_agent_api_failing", node) == 1
    metrics.observe_publisher(True, "")
    assert get("healthd_agent_api_in_sync", node) == 1
    assert get("healthd_agent_api_failing", node) == 0


def test_exposition_parses_and_has_no_duplicate_series(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe_result("remapped", remapped(range(8), pending=(3,)))
    metrics.observe_result("pciebw", pciebw({i: 24.0 for i in range(8)}))
    metrics.observe_state(verdict.initial())
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    names = {f.name for f in families}
    assert {"autopilot_health_checks", "healthd_check_entity_status", "healthd_node_verdict",
            "healthd_check_runs", "healthd_check_duration_seconds"} <= names
    series = [(s.name, tuple(sorted(s.labels.items()))) for f in families for s in f.samples]
    assert len(series) == len(set(series))


def test_gpu_model_falls_back_to_the_first_gpu_then_na(registry: CollectorRegistry) -> None:
    metrics = AgentMetrics(registry, node=NODE)
    metrics.observe_result("dcgm", stamped(builder("dcgm").build()))
    labels = {"health": "dcgm", "node": NODE, "deviceid": "", "cpumodel": "", "gpumodel": "N/A"}
    assert registry.get_sample_value("autopilot_health_checks", labels) == 0
    metrics.observe_result("remapped", remapped(range(1)))
    labels["gpumodel"] = MODEL
    assert registry.get_sample_value("autopilot_health_checks", labels) == 0


def test_cpu_model_from_cpuinfo(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    assert read_cpu_model(str(cpuinfo)) == "Intel(R) Xeon(R) Platinum 8480+"
    assert read_cpu_model(str(tmp_path / "missing")) == ""




@pytest.mark.parametrize("peer_detail", [True, False])
def test_peer_detail_can_be_left_out(peer_detail: bool) -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry, node=NODE, cpu_model="AMD EPYC 9654", gpu_model=MODEL,
                           peer_detail=peer_detail)
    ping = builder("ping")
    ping.seen(Entity("peer", "n2"), loss=0.0, rtt_avg_ms=0.4)
    metrics.observe_result("ping", stamped(ping.build()))
    assert autopilot(registry, "ping", "n2") == 0  # compatibility series either way
    loss = registry.get_sample_value("healthd_peer_ping_loss_ratio", {"node": NODE, "peer": "n2"})
    status = {"node": NODE, "check": "ping", "entity": "peer/n2", "gpu": "", "UUID": "",
              "pci_bus_id": "", "modelName": "", "status": "PASS"}
    shown = registry.get_sample_value("healthd_check_entity_status", status)
    assert (loss, shown) == ((0.0, 1.0) if peer_detail else (None, None))


def test_ping_per_network_series_keep_the_pod_networks_apart(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    ping = builder("ping")
    for peer in ("n2", "n3"):
        ping.seen(Entity.peer(peer), loss=0.0, rtt_avg_ms=0.4, rtt_max_ms=0.9)
    ping.seen(Entity.peer("n2", "net1"), loss=0.0, rtt_avg_ms=0.2, rtt_max_ms=0.3)
    ping.finding("PEER_UNREACHABLE", Entity.peer("n3", "net1"), "no answer", loss=1.0)
    metrics.observe_result("ping", stamped(ping.build()))
    per_network = {n: (registry.get_sample_value("healthd_ping_peers",
                                                 {"node": NODE, "network": n}),
                       registry.get_sample_value("healthd_ping_unreachable_peers",
                                                 {"node": NODE, "network": n}))
                   for n in ("pod", "net1")}
    assert per_network == {"pod": (2, 0), "net1": (2, 1)}
    # The pod network's peer series are as they always were; net1's have their own.
    assert registry.get_sample_value("healthd_peer_ping_loss_ratio",
                                     {"node": NODE, "peer": "n3"}) == 0
    assert registry.get_sample_value("healthd_network_peer_ping_loss_ratio",
                                     {"node": NODE, "peer": "n3", "network": "net1"}) == 1
    assert autopilot(registry, "ping", "n3") == 0  # Autopilot's gauge: the pod network
