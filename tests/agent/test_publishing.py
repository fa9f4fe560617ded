"""The agent end to end, as a user sees it on the Node: the first round's PASS, zero
writes in a steady state, a fault injected mid-run raising label, condition, Event and
metric, recovery after `recover_after` passes, a sticky code that only a clear
request releases, XID 79 reaching the label in seconds, an API server that goes away
and comes back, and other owners' labels, taints and cordon left alone."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from healthd.agent.metrics import read_cpu_model
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import GpuFault, RemappedRowsFault
from tests.agent.harness import (
    FOREIGN_LABELS,
    KEYS,
    NODE,
    ROUND_S,
    TAINTS,
    Harness,
    eventually,
    running_agent,
)

pytestmark = pytest.mark.anyio


def assert_foreign_state_untouched(h: Harness) -> None:
    node = h.node()
    labels = node["metadata"]["labels"]
    assert {k: labels.get(k) for k in FOREIGN_LABELS} == FOREIGN_LABELS
    assert node["spec"] == {"unschedulable": True, "taints": TAINTS}


async def test_healthy_node_shows_pass_then_costs_zero_writes(api: ApiEmulator,
                                                             tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        await eventually(lambda: h.condition() is not None, what="condition")
        condition = h.condition()
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("False", "GPUsHealthy")
        assert '"verdict":"PASS"' in h.annotations()[KEYS.health]
        assert h.metric("healthd_node_verdict", node=NODE, verdict="PASS") == 1
        assert h.metric("healthd_check_status", node=NODE, check="remapped",
                        status="PASS") == 1
        assert await h.scrape("/readyz") == (200, "ok")
        await eventually(lambda: h.parts.publisher.in_sync, what="publisher in sync")
        api.clear_log()
        runs_before = h.metric("healthd_check_runs_total", node=NODE, check="remapped",
                               result="PASS") or 0
        await anyio.sleep(6 * ROUND_S)
        runs_after = h.metric("healthd_check_runs_total", node=NODE, check="remapped",
                              result="PASS") or 0
        assert runs_after - runs_before >= 3  # the checks kept running...
        assert api.writes() == []  # ...and nothing was written
        assert_foreign_state_untouched(h)


async def test_fault_mid_run_raises_at_once_and_recovers_after_two_passes(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        h.sim.nvml.inject(GpuFault(gpu=2, remapped_rows=RemappedRowsFault(pending=True)))
        await eventually(lambda: h.verdict() == "ERR", what="ERR label")
        # The condition goes through nodes/status: a second write, right after the label.
        condition = await eventually(lambda: (c := h.condition()) and c["status"] == "True"
                                     and c, what="condition True")
        assert condition["reason"] == "REMAP_PENDING"
        raised = await eventually(lambda: h.events("REMAP_PENDING"), what="Warning Event")
        assert raised[-1]["type"] == "Warning" and "GPU 2" in raised[-1]["message"]
        assert h.metric("healthd_node_verdict", node=NODE, verdict="ERR") == 1
        assert h.metric("autopilot_health_checks", health="remapped", node=NODE,
                        deviceid="2", cpumodel=read_cpu_model(),
                        gpumodel="NVIDIA H100 80GB HBM3") == 1

        h.sim.nvml.clear_faults(2)
        await eventually(lambda: h.verdict() == "PASS", what="recovery")
        await eventually(lambda: (c := h.condition()) and c["status"] == "False",
                         what="condition False")
        await eventually(lambda: h.events("GPUsHealthy"), what="recovery Event")
        assert_foreign_state_untouched(h)


async def test_sticky_code_stays_until_clear_then_clears_on_a_pass(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        h.sim.nvml.inject(GpuFault(gpu=4, remapped_rows=RemappedRowsFault(failure=True)))
        await eventually(lambda: h.verdict() == "EVICT", what="EVICT label")
        h.sim.nvml.clear_faults(4)
        await anyio.sleep(6 * ROUND_S)  # many clean rounds: a sticky EVICT stays
        assert h.verdict() == "EVICT"

        h.annotate(**{KEYS.clear: "true"})
        await eventually(lambda: h.verdict() == "PASS", what="cleared")
        await eventually(lambda: h.last_run() is not None, what="clear answered")
        answer = h.last_run()
        assert answer is not None
        assert (answer["kind"], answer["accepted"], answer["checks"]) == (
            "clear", True, {"remapped": "PASS"})
        assert KEYS.clear not in h.annotations()
        await eventually(lambda: h.events("HealthCleared"), what="Normal Event for the clear")


async def test_xid79_reaches_the_label_within_two_seconds(api: ApiEmulator,
                                                          tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        started = anyio.current_time()
        h.sim.nvml.emit_xid(5, 79)
        await eventually(lambda: h.verdict() == "EVICT", 2.0, "EVICT within 2 s")
        assert anyio.current_time() - started < 2.0
        await eventually(lambda: (c := h.condition()) and c["reason"] == "XID_79",
                         what="condition names XID_79")
        await eventually(lambda: h.metric("healthd_agent_fault_to_label_seconds_count",
                                          node=NODE), what="fault-to-label measured")
        xids = [s for s in h.agent.registry.collect()
                if s.name == "healthd_gpu_xid_events"]
        assert any(sample.labels.get("gpu") == "5" and sample.labels.get("xid") == "79"
                   and sample.value == 1 for family in xids for sample in family.samples
                   if sample.name.endswith("_total"))


async def test_api_server_away_mid_run_then_back_converges(api: ApiEmulator,
                                                            tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        await api.go_away()
        h.sim.nvml.inject(GpuFault(gpu=1, remapped_rows=RemappedRowsFault(pending=True)))
        await eventually(lambda: h.parts.health.state.verdict.value == "ERR", what="ERR judged")
        await anyio.sleep(4 * ROUND_S)  # checks keep running while the writes fail
        assert h.parts.publisher.last_error
        assert (await h.scrape("/healthz"))[0] == 200
        await api.come_back()
        await eventually(lambda: h.verdict() == "ERR", 10, "ERR written after the API is back")
        await eventually(lambda: h.events("REMAP_PENDING"), 10, "transition Event sent")
        assert_foreign_state_untouched(h)


async def test_no_driver_never_writes_a_label_and_says_unknown(api: ApiEmulator,
                                                               tmp_path: Path) -> None:
    async with running_agent(api, tmp_path, spec="no-driver") as h:
        condition = await eventually(h.condition, what="condition")
        assert condition["status"] == "Unknown"
        await anyio.sleep(3 * ROUND_S)
        assert KEYS.gpuhealth not in h.labels()
        assert h.metric("healthd_check_status", node=NODE, check="remapped",
                        status="UNKNOWN") == 1
        assert_foreign_state_untouched(h)
