"""Every benchmark in `bench/` runs (`--quick`) and prints one JSON object with the
machine, the date, its figures and each goal as value/goal/met. Timings are never
asserted: a missed goal is a figure, not a failure. The benchmarks run side by side
to keep this module fast."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import programs
from tests.realcluster.fixture import unavailable

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"

# benchmark -> (extra arguments, figures it must report, goals it must judge)
EXPECTED: dict[str, tuple[list[str], set[str], set[str]]] = {
    "fault_to_label": ([], {"poll_interval_s", "xid79", "remap_pending"},
                       {"xid79_p99_s", "remap_pending_p99_s"}),
    "label_to_reset": ([], {"scales", "scaling_exponent"},
                       {"latency_p99_s_at_largest", "nodes_per_s_at_largest"}),
    "steady_state_writes": ([], {"writes_per_node_per_hour", "lists_per_node_per_hour",
                                 "requests_by_kind"},
                            {"writes_per_node_per_hour", "lists_per_node_per_hour"}),
    "nvml_round": ([], {"simulated_8_gpus", "real_gpu"}, {"simulated_8_gpus_p99_ms"}),
    "agent_footprint": (["--minutes", "0.1"], {"rss_mib_peak", "cpu_pct_of_core_steady"},
                        {"rss_mib_peak", "cpu_pct_of_core_steady"}),
    "lending_recompute": ([], {"one_change_ms", "nodes"}, {"one_change_p99_ms"}),
    "flapping": ([], {"blips", "oscillating", "ping_loss", "release_bound_runs"},
                 {"blips_label_changes_per_1000", "oscillating_label_changes_per_1000",
                  "ping_loss_label_changes_per_1000", "ping_loss_raise_runs"}),
    "pciebw_child": ([], {"size_mib", "cuda_child", "sim_child"}, set()),
    "peer_load": ([], {"measured", "computed_at_n", "computed_at_10000", "formulas"},
                  {"steady_state_writes", "most_peers_per_network"}),
    "demo_repair": ([], {"runs", "passed", "fault_to_pass", "reset_job_s", "since_fault"},
                    set()),
    "memory_soak": (["--minutes", "0.5", "--agents", "1"],
                    {"processes", "churn", "agent_slope_tail_median"},
                    {"controller_slope_kib_per_min_tail", "agent-0_slope_kib_per_min_tail"}),
}

# Benchmarks that only run on the real control plane: each has its own e2e test below.
REAL_ONLY = {"repair_real"}


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, subprocess.CompletedProcess[str]]]:
    """Start every benchmark at once; collect each one's exit code and output."""
    procs = {
        name: subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), "--quick", *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, (extra, _, _) in EXPECTED.items()
    }
    done: dict[str, subprocess.CompletedProcess[str]] = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=110)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        yield done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_every_benchmark_is_covered() -> None:
    # real_gpu, the real-GPU acceptance run, has its own tests (test_real_gpu.py);
    # reset_cluster is label_to_reset's cluster, real_api the real control plane's
    # plumbing and gpu_load the load real_gpu runs beside pciebw, not benchmarks
    scripts = {p.stem for p in BENCH.glob("*.py")} - {"common", "real_gpu", "reset_cluster",
                                                       "real_api", "gpu_load"}
    assert scripts == set(EXPECTED) | REAL_ONLY


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_benchmark_prints_one_json_object_with_its_figures_and_goals(
        runs: dict[str, subprocess.CompletedProcess[str]], name: str) -> None:
    run = runs[name]
    assert run.returncode == 0, run.stderr[-3000:]
    report: dict[str, Any] = json.loads(run.stdout)
    _, figures, goals = EXPECTED[name]
    assert report["benchmark"] == name and report["quick"] is True
    assert report["date"] and report["machine"]["nproc"] >= 1 and report["machine"]["cpu_model"]
    assert figures <= set(report["figures"]), sorted(report["figures"])
    assert goals <= set(report["goals"])
    for goal in report["goals"].values():
        assert set(goal) == {"value", "goal", "op", "met"}
        assert isinstance(goal["value"], (int, float)) and isinstance(goal["met"], bool)


def test_a_benchmark_that_cannot_measure_still_prints_json_and_fails() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "label_to_reset.py"), "--nodes", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["benchmark"] == "label_to_reset" and report["error"]


def test_label_to_reset_counts_what_each_reset_asks_of_the_server(
        runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    row = json.loads(runs["label_to_reset"].stdout)["figures"]["scales"][0]
    resets, nodes = row["burst_appwrappers_reset"], row["burst_nodes"]
    served = row["burst_server_served"]  # the emulator's request log, by kind
    # Per reset one status patch and one Event on the AppWrapper; per node one Event;
    # the slack queue a few times, never once per node; nothing read back.
    assert served["requests PATCH appwrappers/status"] == resets
    assert served["requests POST events/AppWrapper"] == resets
    assert served["requests POST events/Node"] == nodes
    assert 1 <= served["requests PATCH clusterqueues"] < nodes
    assert not [kind for kind in served if kind.startswith("requests GET")]
    # The controller's own count agrees with the server's, bytes included.
    per_reset = row["writes_per_reset_burst"]["PATCH appwrappers/status"]
    assert per_reset["requests"] == 1.0
    assert per_reset["sent_bytes"] * resets == served["request_bytes PATCH appwrappers/status"]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_label_to_reset_measures_on_the_real_api_server() -> None:
    # A small cluster (90 nodes, 4 pods each) keeps this near half a minute; its nodes
    # heartbeat as kubelets do, the idle window not waiting for their first reports.
    if programs.go_binary() is None:
        unavailable("needs Go (>= 1.25) on PATH to build the real control plane")
    proc = subprocess.run([sys.executable, str(BENCH / "label_to_reset.py"), "--quick",
                           "--api", "real", "--nodes", "90", "--pods-per-node", "4",
                           "--heartbeat", "lease", "--idle-from-s", "0"],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    row = report["figures"]["scales"][0]
    assert (row["api_server"], row["nodes"], row["pods"]) == ("kube-apiserver", 90, 360)
    assert row["memory"]["cached"] == {"nodes": 90, "pods": 360, "appwrappers": 90}
    assert row["latency_s"]["n"] == 5 * 4  # each of the 5 faults: its 4 AppWrappers reset
    assert row["burst_appwrappers_reset"] > 0 and row["burst_requests"]["event_post"] > 0
    # kube-apiserver's /metrics saw the controller's status patches, one per reset
    served = row["burst_server_served"]
    assert served["requests PATCH appwrappers/status"] == row["burst_appwrappers_reset"]
    assert row["writes_per_reset_burst"]["PATCH appwrappers/status"]["requests"] == 1.0
    # The seeded pods were Running (the seeding waits for it) and every EVICT label
    # reached the server as a Node write.
    assert row["heartbeat"] == "lease" and row["idle_node_writes_per_s"] >= 0
    by_writer = row["idle_node_writes_per_s_by_writer"]  # each write counted once more
    rounding = 0.1 * (len(by_writer) + 1)
    assert abs(sum(by_writer.values()) - row["idle_node_writes_per_s"]) <= rounding
    assert row["burst_requests"]["node_modified"] >= row["burst_nodes"]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_repair_real_times_each_step_from_fault_to_pass_on_the_real_control_plane() -> None:
    if programs.go_binary() is None:
        unavailable("needs Go (>= 1.25) on PATH to build the real control plane")
    proc = subprocess.run([sys.executable, str(BENCH / "repair_real.py"), "--quick"],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    figures = report["figures"]
    assert (figures["api_server"], figures["runs"]) == ("kube-apiserver", 1)
    assert {"fault_to_pass", "evict_to_appwrapper_reset", "reset_container"} <= set(
        figures["busy"])
    assert {"fault_to_pass", "evict_to_job", "reset_container"} <= set(figures["idle"])
    for kind in ("busy", "idle"):
        assert all(step["n"] == 1 for step in figures[kind].values()), figures[kind]
