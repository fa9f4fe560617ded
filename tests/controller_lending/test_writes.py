"""How lendingLimits are written: guarded JSON patches that lose to a concurrent writer
instead of overwriting it, zero writes when the queue is already right (a restart)
or in dry run, no hot loop on a queue without a cohort or on a server that refuses
the value, Events that explain each change and every shortfall."""

from __future__ import annotations

import logging
import re

import anyio
import pytest

from healthd.kube.client import Kube
from healthd.kube.conventions import Reason
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.recording import Fault
from tests.controller_lending.helpers import (
    QUEUE_PATH,
    RecordingMetrics,
    edit,
    events,
    flavor,
    lending,
    limit_of,
    node,
    queue_writes,
    set_verdict,
    settle,
    simple_queue,
    until,
)

pytestmark = pytest.mark.anyio


def entry(q: dict) -> dict:
    return q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]


def hold_next_patch(api: ApiEmulator, delay: float) -> Fault:
    """Delay our next queue PATCH on arrival; `.times` drops to 0 once it arrived."""
    fault = Fault("PATCH", re.compile(QUEUE_PATH), None, None, delay, 1)
    api.recorder.add_fault(fault)
    return fault


def successful_values(api: ApiEmulator) -> list[object]:
    """The lendingLimit values of every PATCH the server accepted."""
    return [op.get("value") for w in queue_writes(api) if w.status == 200 for op in w.body
            if op["op"] in ("add", "replace") and op["path"].endswith("/lendingLimit")]


async def test_write_is_a_guarded_json_patch_with_an_event(api: ApiEmulator,
                                                            kube: Kube) -> None:
    api.seed(node("n1"), node("n2"), flavor("default-flavor"), simple_queue("6"))
    async with lending(kube):
        set_verdict(api, "n1", "EVICT")
        await until(lambda: limit_of(api) == "2")
        await until(lambda: events(api, Reason.LENDING_LIMIT_UPDATED))
    (write,) = queue_writes(api)
    assert write.content_type.startswith("application/json-patch+json")
    tests = {op["path"]: op["value"] for op in write.body if op["op"] == "test"}
    assert tests["/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota"] == "6"
    assert "/metadata/resourceVersion" in tests  # no old value to test: guard the object
    (event,) = events(api, Reason.LENDING_LIMIT_UPDATED)
    assert event["involvedObject"]["kind"] == "ClusterQueue"
    assert "n1" in event["message"] and "unset -> 2" in event["message"]


async def test_restart_with_valid_limit_writes_nothing(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", verdict="EVICT"), node("n2"), flavor("default-flavor"),
             simple_queue(("6", "2")))
    for _ in range(2):  # a first start, then a restart
        async with lending(kube):
            await settle(api)
    assert api.writes() == []
    assert limit_of(api) == "2"


async def test_restart_corrects_a_stale_limit(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", verdict="EVICT"), node("n2"), flavor("default-flavor"),
             simple_queue(("6", "5")))
    async with lending(kube):
        await until(lambda: limit_of(api) == "2")
    (write,) = queue_writes(api)
    assert {"op": "test", "path": "/spec/resourceGroups/0/flavors/0/resources/0/lendingLimit",
            "value": "5"} in write.body


async def test_dry_run_decides_and_writes_nothing(api: ApiEmulator, kube: Kube,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    api.seed(node("n1"), node("n2"), flavor("default-flavor"), simple_queue("6"))
    metrics = RecordingMetrics()
    with caplog.at_level(logging.INFO, logger="healthd.controller.clusterqueues"):
        async with lending(kube, dry_run=True, metrics=metrics):
            set_verdict(api, "n1", "EVICT")
            set_verdict(api, "n2", "EVICT")  # 8 unavailable: a shortfall too
            await until(lambda: ("slack-cluster-queue", "dry-run") in metrics.writes)
            await settle(api)
    assert api.writes("PATCH") == [] and api.writes("POST") == []
    assert limit_of(api) is None
    assert "would patch queue slack-cluster-queue" in caplog.text
    assert "lendingLimit unset -> 0" in caplog.text
    assert f"would record {Reason.LENDING_SHORTFALL}" in caplog.text
    state = metrics.lending[("slack-cluster-queue", "default-flavor", "nvidia.com/gpu")]
    assert state["limit"] == 0 and state["shortfall"] == 2


async def test_shortfall_warning_event(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", verdict="EVICT"), node("n2", verdict="TESTING"),
             flavor("default-flavor"), simple_queue("6"))
    async with lending(kube):
        await until(lambda: limit_of(api) == "0" and events(api, Reason.LENDING_SHORTFALL))
        await settle(api)
    (event,) = events(api, Reason.LENDING_SHORTFALL)
    assert event["type"] == "Warning"
    assert "8 unavailable" in event["message"] and "2 short" in event["message"]


async def test_no_cohort_event_and_no_hot_loop(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"), node("n2"), flavor("default-flavor"), simple_queue("6", cohort=None))
    async with lending(kube):
        set_verdict(api, "n1", "EVICT")
        await until(lambda: events(api, Reason.LENDING_LIMIT_REJECTED))
        for verdict in ("TESTING", "PASS", "TESTING", "PASS"):  # churn: must not loop
            set_verdict(api, "n2", verdict)
        await settle(api)
        before = len(api.requests)
        await anyio.sleep(1.0)
        assert len(api.requests) - before <= 2  # nothing but the odd watch renewal
        assert queue_writes(api) == []
        assert len(events(api, Reason.LENDING_LIMIT_REJECTED)) == 1
        assert "cohortName" in events(api, Reason.LENDING_LIMIT_REJECTED)[0]["message"]

        edit(api, "ClusterQueue", "slack-cluster-queue",
             lambda q: q["spec"].update(cohortName="default-cohort"))
        await until(lambda: limit_of(api) == "2")


async def test_refused_value_backs_off(api: ApiEmulator, kube: Kube) -> None:
    """A 422 on an unchanged object is the server (Kueue's webhook) refusing the value:
    a Warning Event, then exponential backoff, then success once it accepts."""
    api.seed(node("n1"), flavor("default-flavor"), simple_queue("6"))
    api.fail("PATCH", QUEUE_PATH, 422, times=1000,
             body={"kind": "Status", "code": 422, "reason": "Invalid",
                   "message": "spec.resourceGroups[0]: lendingLimit: must be nil"})
    async with lending(kube):
        set_verdict(api, "n1", "EVICT")
        await until(lambda: events(api, Reason.LENDING_LIMIT_REJECTED))
        await anyio.sleep(1.5)
        assert len(api.requests_to("PATCH", QUEUE_PATH)) <= 3
        assert "must be nil" in events(api, Reason.LENDING_LIMIT_REJECTED)[0]["message"]
        api.clear_faults()
        await until(lambda: limit_of(api) == "2", timeout=10)


CONFLICT = {"kind": "Status", "code": 409, "reason": "Conflict",
            "message": "the object has been modified; please apply your changes to the "
                       "latest version and try again"}


def queue_answering_409(api: ApiEmulator, times: int) -> None:
    """A queue whose next `times` PATCHes meet a conflict."""
    api.seed(node("n1"), flavor("default-flavor"), simple_queue("6"))
    api.fail("PATCH", QUEUE_PATH, 409, times=times, body=CONFLICT)


async def test_a_409_is_retried_against_the_fresh_queue_without_a_warning(
        api: ApiEmulator, kube: Kube) -> None:
    queue_answering_409(api, 2)
    async with lending(kube):
        set_verdict(api, "n1", "EVICT")
        await until(lambda: limit_of(api) == "2")
        await until(lambda: events(api, Reason.LENDING_LIMIT_UPDATED))
        await settle(api)
    assert [w.status for w in queue_writes(api)] == [409, 409, 200]
    assert events(api, Reason.LENDING_LIMIT_REJECTED) == []
    assert events(api, Reason.LENDING_LIMIT_CONFLICT) == []


async def test_409_on_every_retry_is_one_conflict_warning_then_backoff(
        api: ApiEmulator, kube: Kube) -> None:
    queue_answering_409(api, 1000)
    async with lending(kube):
        set_verdict(api, "n1", "EVICT")
        await until(lambda: events(api, Reason.LENDING_LIMIT_CONFLICT))
        await anyio.sleep(1.5)
        (event,) = events(api, Reason.LENDING_LIMIT_CONFLICT)
        assert event["type"] == "Warning" and "conflict" in event["message"]
        assert events(api, Reason.LENDING_LIMIT_REJECTED) == []
        assert len(api.requests_to("PATCH", QUEUE_PATH)) <= 8  # backs off, no hot loop
        api.clear_faults()
        await until(lambda: limit_of(api) == "2", timeout=10)


async def test_concurrent_nominal_change_wins(api: ApiEmulator, kube: Kube) -> None:
    """The queue changes between our read and our write: the write fails its test,
    we re-read, recompute and converge; no stale value is ever stored."""
    api.seed(node("n1"), flavor("default-flavor"), simple_queue("6"))
    async with lending(kube):
        held = hold_next_patch(api, 0.5)  # our first write, computed from nominal 6
        set_verdict(api, "n1", "EVICT")
        await until(lambda: held.times == 0)
        edit(api, "ClusterQueue", "slack-cluster-queue",
             lambda q: entry(q).update(nominalQuota="10"))
        await until(lambda: limit_of(api) == "6")
        await settle(api)
    assert successful_values(api) == ["6"]
    assert any(w.status == 422 for w in queue_writes(api))


async def test_concurrent_limit_writer_is_not_overwritten_blindly(api: ApiEmulator,
                                                                  kube: Kube) -> None:
    """Someone adds a lendingLimit while ours (for an absent field) is in flight: the
    `add` must fail, and the next write must test the value they wrote."""
    api.seed(node("n1"), flavor("default-flavor"), simple_queue("6"))
    async with lending(kube):
        held = hold_next_patch(api, 0.5)
        set_verdict(api, "n1", "EVICT")
        await until(lambda: held.times == 0)
        edit(api, "ClusterQueue", "slack-cluster-queue",
             lambda q: entry(q).update(lendingLimit="5"))
        await until(lambda: any(w.status == 200 for w in queue_writes(api)))
        await settle(api)
    assert limit_of(api) == "2"
    final = next(w for w in queue_writes(api) if w.status == 200)
    assert {"op": "test", "path": "/spec/resourceGroups/0/flavors/0/resources/0/lendingLimit",
            "value": "5"} in final.body


async def test_no_write_before_the_node_cache_synced(api: ApiEmulator, kube: Kube) -> None:
    """A restart whose node list is slow: a writer that did not wait would see no bad
    node and remove a limit that is still right."""
    api.seed(node("n1", verdict="EVICT"), node("n2"), flavor("default-flavor"),
             simple_queue(("6", "2")))
    api.fail("GET", "/api/v1/nodes", None, delay=0.5, query={"watch": ""})
    async with lending(kube) as stack:
        assert len(stack.caches.nodes) == 2
        await settle(api)
    assert queue_writes(api) == []

