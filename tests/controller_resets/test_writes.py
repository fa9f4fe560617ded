"""What a reset writes and how it behaves under concurrent writers: one status
write per AppWrapper however many of its nodes are bad, the written phase and
condition, the conditions it must keep, the Events, and a test-guarded patch that
never writes over a change it did not see."""

from __future__ import annotations

import pytest

from healthd.controller.appwrappers import Resetter
from healthd.controller.metrics import ControllerMetrics
from healthd.controller.resets import decide
from healthd.kube.client import Kube
from healthd.kube.conventions import Verdict
from healthd.kube.objects import APPWRAPPERS, PODS, Resource
from healthd.sim.apiserver import ApiEmulator
from tests.controller_resets.conftest import (
    NS,
    T0,
    MakeResetter,
    appwrapper,
    count,
    events,
    evict_map,
    node,
    pod,
    reconcile,
    reset_writes,
    stored_aw,
)

pytestmark = pytest.mark.anyio


def by_type(aw: dict) -> dict[str, dict]:
    return {c["type"]: c for c in aw["status"]["conditions"]}


async def test_one_write_for_pods_on_two_evict_nodes(api: ApiEmulator, kube: Kube,
                                                     make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), node("n2", Verdict.EVICT, "REMAP_FAILURE"),
             appwrapper("job"), pod("job-0", "job", "n1"), pod("job-1", "job", "n1"),
             pod("job-2", "job", "n2"))

    assert await reconcile(kube, make_resetter()) == {f"{NS}/job": "reset"}

    (write,) = reset_writes(api, "job")
    condition = by_type(stored_aw(api, "job"))["Unhealthy"]
    assert condition["message"] == ("Pods of this AppWrapper use GPUs on EVICT nodes: "
                                    "n1 (XID_79), n2 (REMAP_FAILURE)")
    assert write.body[0] == {"op": "test", "path": "/status/phase", "value": "Running"}


async def test_two_appwrappers_on_one_node_each_reset_once(api: ApiEmulator, kube: Kube,
                                                           make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("a"), appwrapper("b"),
             pod("a-0", "a", "n1"), pod("b-0", "b", "n1"))
    resetter = make_resetter()

    first = await reconcile(kube, resetter)
    again = await reconcile(kube, resetter)  # the next event: both already left Running

    assert first == {f"{NS}/a": "reset", f"{NS}/b": "reset"}
    assert again == {}
    assert len(reset_writes(api, "a")) == 1
    assert len(reset_writes(api, "b")) == 1


async def test_written_status_keeps_other_conditions(api: ApiEmulator, kube: Kube,
                                                     make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79", "ECC_UNCORRECTED"), appwrapper("job"),
             pod("job-0", "job", "n1"))
    before = by_type(stored_aw(api, "job"))

    await reconcile(kube, make_resetter())

    aw = stored_aw(api, "job")
    conditions = by_type(aw)
    assert aw["status"]["phase"] == "Resetting"
    assert aw["status"]["resettingCount"] == 1  # node-health resets cost no retry
    assert conditions["Unhealthy"] == {
        "type": "Unhealthy", "status": "True", "reason": "NodeEvicted",
        "message": "Pods of this AppWrapper use GPUs on EVICT nodes: n1 (XID_79, ECC_UNCORRECTED)",
        "lastTransitionTime": "2025-06-15T15:06:40Z", "observedGeneration": 3}
    assert conditions["QuotaReserved"] == before["QuotaReserved"]
    assert conditions["PodsReady"] == before["PodsReady"]
    assert [c["type"] for c in aw["status"]["conditions"]] == list(before)


async def test_reset_without_conditions_adds_them(api: ApiEmulator, kube: Kube,
                                                  make_resetter: MakeResetter) -> None:
    bare = appwrapper("job")
    del bare["status"]["conditions"]
    api.seed(node("n1", Verdict.EVICT), bare, pod("job-0", "job", "n1"))

    await reconcile(kube, make_resetter())

    (condition,) = stored_aw(api, "job")["status"]["conditions"]
    assert condition["reason"] == "NodeEvicted"
    assert condition["message"].endswith("n1 (EVICT)")  # no health annotation: the verdict


async def test_events_on_appwrapper_and_node(api: ApiEmulator, kube: Kube,
                                             make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))

    await reconcile(kube, make_resetter())

    (on_aw,) = events(api, "NodeEvicted")
    assert on_aw["type"] == "Warning"
    assert on_aw["involvedObject"]["kind"] == "AppWrapper"
    assert on_aw["involvedObject"]["name"] == "job"
    assert on_aw["metadata"]["namespace"] == NS
    (on_node,) = events(api, "AppWrapperReset")
    assert on_node["involvedObject"] == {"kind": "Node", "apiVersion": "v1", "name": "n1",
                                         "uid": api.get("Node", "n1")["metadata"]["uid"]}
    assert f"{NS}/job" in on_node["message"] and "XID_79" in on_node["message"]


async def test_phase_changed_between_read_and_write(api: ApiEmulator, kube: Kube,
                                                    make_resetter: MakeResetter,
                                                    metrics: ControllerMetrics) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))
    stale = await kube.get(APPWRAPPERS, "job", NS)
    decision = decide(stale, [await kube.get(*_pod("job-0"))], await evict_map(kube))
    assert decision is not None
    # The AppWrapper operator moves it on before our write lands.
    moved = stored_aw(api, "job")
    moved["status"]["phase"] = "Suspending"
    api.put(moved)

    result = await make_resetter().reset(decision, appwrapper=stale)

    assert result == "conflict-retry"
    assert [w.status for w in reset_writes(api)] == [422]  # the test op refused it
    aw = stored_aw(api, "job")
    assert aw["status"]["phase"] == "Suspending"
    assert by_type(aw)["Unhealthy"]["reason"] == "FoundNoFailedPods"
    assert events(api, "NodeEvicted") == []
    assert count(metrics, "conflict-retry") == 1


async def test_conditions_changed_between_read_and_write(api: ApiEmulator, kube: Kube,
                                                         make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))
    stale = await kube.get(APPWRAPPERS, "job", NS)
    decision = decide(stale, [await kube.get(*_pod("job-0"))], await evict_map(kube))
    assert decision is not None
    changed = stored_aw(api, "job")  # still Running, but another condition moved
    by_type(changed)["PodsReady"]["message"] = "2 pods running"
    api.put(changed)

    result = await make_resetter().reset(decision, appwrapper=stale)

    assert result == "reset"
    assert [w.status for w in reset_writes(api)] == [422, 200]
    conditions = by_type(stored_aw(api, "job"))
    assert conditions["PodsReady"]["message"] == "2 pods running"  # not overwritten
    assert conditions["Unhealthy"]["reason"] == "NodeEvicted"


async def test_deleted_appwrapper_is_gone(api: ApiEmulator, kube: Kube,
                                          make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))
    aw = await kube.get(APPWRAPPERS, "job", NS)
    decision = decide(aw, [await kube.get(*_pod("job-0"))], await evict_map(kube))
    assert decision is not None
    api.remove("AppWrapper", "job", NS)

    assert await make_resetter().reset(decision) == "gone"
    assert await make_resetter().reset(decision, appwrapper=aw) == "gone"
    assert events(api, "NodeEvicted") == []


async def test_server_error_is_counted_and_gives_the_token_back(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter,
        metrics: ControllerMetrics) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))
    resetter: Resetter = make_resetter(resets={"burst": 1})
    api.fail("PATCH", ".*/appwrappers/job/status", 500)

    assert await reconcile(kube, resetter) == {f"{NS}/job": "error"}
    assert await reconcile(kube, resetter) == {f"{NS}/job": "reset"}  # not rate-limited
    assert count(metrics, "error") == 1
    assert count(metrics, "reset") == 1
    assert stored_aw(api, "job")["status"]["phase"] == "Resetting"


async def test_label_to_reset_latency_is_observed(api: ApiEmulator, kube: Kube,
                                                  make_resetter: MakeResetter,
                                                  metrics: ControllerMetrics) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))
    aw = await kube.get(APPWRAPPERS, "job", NS)
    decision = decide(aw, [await kube.get(*_pod("job-0"))], await evict_map(kube))
    assert decision is not None

    await make_resetter().reset(decision, appwrapper=aw, since=T0 - 0.3)

    sample = metrics.registry.get_sample_value
    assert sample("healthd_controller_label_to_reset_seconds_count") == 1
    assert sample("healthd_controller_label_to_reset_seconds_bucket", {"le": "0.25"}) == 0
    assert sample("healthd_controller_label_to_reset_seconds_bucket", {"le": "0.5"}) == 1


def _pod(name: str) -> tuple[Resource, str, str]:
    return PODS, name, NS
