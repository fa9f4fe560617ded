"""The safety rails on resets, with a hand-driven clock: the token bucket, the
per-AppWrapper spacing (in memory and from the AppWrapper's own condition, so a
restart respects it), a flapping label, the circuit breaker opening on a mass
failure and closing by itself after the hold, and dry run writing nothing."""

from __future__ import annotations

import logging

import pytest

from healthd.config.controller import ControllerSettings
from healthd.controller.metrics import ControllerMetrics
from healthd.controller.safety import Breaker, BreakerState, Spacing, TokenBucket
from healthd.kube.client import Kube
from healthd.kube.conventions import Verdict
from healthd.kube.objects import LEASES
from healthd.sim.apiserver import ApiEmulator
from tests.controller_resets.conftest import (
    NS,
    FakeClock,
    MakeResetter,
    appwrapper,
    count,
    events,
    node,
    pod,
    reconcile,
    reset_writes,
    stored_aw,
)

pytestmark = pytest.mark.anyio


# -- pure ------------------------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_the_rate(clock: FakeClock) -> None:
    bucket = TokenBucket(rate_per_s=0.5, burst=2, clock=clock)

    assert [bucket.take() for _ in range(3)] == [True, True, False]
    assert bucket.wait_s() == pytest.approx(2.0)
    clock.advance(1.9)
    assert not bucket.take()
    clock.advance(0.1)
    assert bucket.take()
    clock.advance(3600)  # a long quiet spell refills only up to the burst
    assert [bucket.take() for _ in range(3)] == [True, True, False]


def test_spacing_from_memory_and_from_the_object(clock: FakeClock) -> None:
    spacing = Spacing(300, clock)
    spacing.record("ns/a")

    clock.advance(299)
    assert not spacing.allowed("ns/a")
    assert spacing.allowed("ns/b")
    assert not spacing.allowed("ns/b", last_from_object=clock() - 10)
    clock.advance(1)
    assert spacing.allowed("ns/a")


def test_breaker_opens_above_the_share_and_closes_after_the_hold(clock: FakeClock) -> None:
    breaker = Breaker("30%", window_s=300, hold_s=120, clock=clock)
    assert breaker.update(0, 10) is BreakerState.CLOSED
    assert breaker.update(3, 10) is BreakerState.CLOSED  # 30% is not more than 30%

    assert breaker.update(4, 10) is BreakerState.OPEN
    clock.advance(60)
    assert breaker.update(3, 10) is BreakerState.OPEN  # under, but not for the hold yet
    assert breaker.next_change_s() == pytest.approx(120)
    clock.advance(100)
    assert breaker.update(5, 10) is BreakerState.OPEN  # back over: the hold starts again
    breaker.update(1, 10)
    clock.advance(119)
    assert breaker.open
    clock.advance(1)
    assert not breaker.open  # closes by itself, without a further update


def test_breaker_counts_nodes_that_turned_bad_within_the_window(clock: FakeClock) -> None:
    breaker = Breaker("5", window_s=60, hold_s=10, clock=clock)
    for bad in range(0, 9, 2):  # two more bad nodes every 40 s: a slow, real decline
        assert breaker.update(bad, 100) is BreakerState.CLOSED
        clock.advance(40)
    assert breaker.update(14, 100) is BreakerState.OPEN  # six at once


def test_breaker_a_quiet_fleet_that_stays_bad_does_not_trip(clock: FakeClock) -> None:
    breaker = Breaker("30%", window_s=60, hold_s=10, clock=clock)
    for bad in (10, 20, 29):
        breaker.update(bad, 100)
        clock.advance(61)
    clock.advance(3600)  # no change for an hour, then an unrelated node event

    assert breaker.update(29, 100) is BreakerState.CLOSED
    assert breaker.update(31, 100) is BreakerState.CLOSED  # two more: no mass failure


def test_breaker_starting_in_a_mass_failure_is_open(clock: FakeClock) -> None:
    breaker = Breaker("30%", window_s=300, hold_s=60, clock=clock)

    assert breaker.update(40, 100) is BreakerState.OPEN


# (GPU nodes, bad nodes at once the default breaker tolerates): 30% or 1, the larger.
DEFAULT_TOLERANCE = [(1, 1), (2, 1), (3, 1), (10, 3), (100, 30)]


@pytest.mark.parametrize(("gpu_nodes", "tolerated"), DEFAULT_TOLERANCE)
def test_default_breaker_tolerates_the_larger_of_the_share_and_the_floor(
        clock: FakeClock, gpu_nodes: int, tolerated: int) -> None:
    def default_breaker() -> Breaker:
        trip = ControllerSettings().breaker
        return Breaker(trip.max_unhealthy, trip.window, trip.hold, clock,
                       min_allowed=trip.min_allowed)

    assert default_breaker().update(tolerated, gpu_nodes) is BreakerState.CLOSED
    if tolerated < gpu_nodes:  # one more node going bad at once opens it
        assert default_breaker().update(tolerated + 1, gpu_nodes) is BreakerState.OPEN


def test_without_the_floor_one_bad_node_of_three_opens_the_breaker(clock: FakeClock) -> None:
    assert Breaker("30%", 300, 300, clock, min_allowed=0).update(1, 3) is BreakerState.OPEN
    assert Breaker("30%", 300, 300, clock, min_allowed=1).update(1, 3) is BreakerState.CLOSED
    assert Breaker("2", 300, 300, clock, min_allowed=5).update(5, 100) is BreakerState.CLOSED


def test_breaker_rejects_a_bad_threshold(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="percentage"):
        Breaker("lots", window_s=60, hold_s=60, clock=clock)


# -- through the emulator --------------------------------------------------------------


async def test_rate_limit_holds_resets_back(api: ApiEmulator, kube: Kube, clock: FakeClock,
                                            make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("a"), appwrapper("b"),
             pod("a-0", "a", "n1"), pod("b-0", "b", "n1"))
    resetter = make_resetter(resets={"rate_per_minute": 1, "burst": 1})

    first = await reconcile(kube, resetter)
    assert sorted(first.values()) == ["rate-limited", "reset"]
    clock.advance(60)
    second = await reconcile(kube, resetter)

    assert list(second.values()) == ["reset"]
    assert len(reset_writes(api)) == 2


async def test_flapping_label_within_the_spacing_resets_once(
        api: ApiEmulator, kube: Kube, clock: FakeClock, make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))
    resetter = make_resetter(resets={"min_spacing": "5m"})
    assert await reconcile(kube, resetter) == {f"{NS}/job": "reset"}
    # The operator resumes it (a fresh pod lands on n1 again) and n1 flaps PASS -> EVICT.
    resumed = appwrapper("job")
    api.seed(resumed, node("n1", Verdict.PASS))
    clock.advance(60)
    assert await reconcile(kube, resetter) == {}
    api.seed(node("n1", Verdict.EVICT, "XID_79"))
    clock.advance(60)

    assert await reconcile(kube, resetter) == {f"{NS}/job": "spacing"}
    assert len(reset_writes(api)) == 1
    clock.advance(181)
    assert await reconcile(kube, resetter) == {f"{NS}/job": "reset"}  # a fault still there


async def test_restarted_controller_respects_the_spacing_from_the_object(
        api: ApiEmulator, kube: Kube, clock: FakeClock, make_resetter: MakeResetter) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"), pod("job-0", "job", "n1"))
    assert await reconcile(kube, make_resetter()) == {f"{NS}/job": "reset"}
    back = stored_aw(api, "job")  # Running again, our Unhealthy condition still there
    back["status"]["phase"] = "Running"
    api.put(back)
    clock.advance(30)

    restarted = make_resetter()  # no memory of the first reset
    assert await reconcile(kube, restarted) == {f"{NS}/job": "spacing"}
    assert len(reset_writes(api)) == 1
    clock.advance(300)
    assert await reconcile(kube, restarted) == {f"{NS}/job": "reset"}


async def test_breaker_stops_resets_and_resumes_after_recovery(
        api: ApiEmulator, kube: Kube, clock: FakeClock, make_resetter: MakeResetter,
        metrics: ControllerMetrics) -> None:
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "healthd-controller", "namespace": "healthd-system"}}
    subject = await kube.create(LEASES, lease)
    api.seed(*(node(f"n{i}") for i in range(6, 10)))
    api.seed(*(node(f"n{i}", Verdict.EVICT, "DCGM_PCIE") for i in range(4)), node("n5"))
    for i in range(4):
        api.seed(appwrapper(f"job{i}"), pod(f"job{i}-0", f"job{i}", f"n{i}"))
    resetter = make_resetter(subject=subject, breaker={"max_unhealthy": "30%", "hold": "2m"})

    assert await resetter.observe_fleet(bad_nodes=4, gpu_nodes=10) is BreakerState.OPEN
    results = await reconcile(kube, resetter)

    assert set(results.values()) == {"breaker-open"}
    assert reset_writes(api) == []
    assert metrics.registry.get_sample_value("healthd_controller_breaker_open") == 1
    (opened,) = events(api, "ResetBreakerOpen")
    assert opened["type"] == "Warning" and "4 of 10 GPU nodes" in opened["message"]

    api.seed(*(node(f"n{i}") for i in range(1, 4)))  # three recover, n0 stays EVICT
    assert await resetter.observe_fleet(bad_nodes=1, gpu_nodes=10) is BreakerState.OPEN
    clock.advance(120)
    assert await resetter.observe_fleet(bad_nodes=1, gpu_nodes=10) is BreakerState.CLOSED
    assert metrics.registry.get_sample_value("healthd_controller_breaker_open") == 0
    assert len(events(api, "ResetBreakerClosed")) == 1

    assert await reconcile(kube, resetter) == {f"{NS}/job0": "reset"}  # what is still due
    assert [stored_aw(api, f"job{i}")["status"]["phase"] for i in range(4)] == \
        ["Resetting", "Running", "Running", "Running"]


async def test_one_evict_node_of_three_is_reset_with_the_default_breaker(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter) -> None:
    """The MLBatch tutorial's cluster size: one bad node of three is 33%, over 30%."""
    api.seed(node("n0", Verdict.EVICT, "XID_79"), node("n1"), node("n2"),
             appwrapper("job"), pod("job-0", "job", "n0"))
    resetter = make_resetter()

    assert await resetter.observe_fleet(bad_nodes=1, gpu_nodes=3) is BreakerState.CLOSED
    assert await reconcile(kube, resetter) == {f"{NS}/job": "reset"}
    assert stored_aw(api, "job")["status"]["phase"] == "Resetting"


async def test_dry_run_decides_logs_counts_and_writes_nothing(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter, metrics: ControllerMetrics,
        caplog: pytest.LogCaptureFixture) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), node("n2", Verdict.EVICT, "XID_48"),
             appwrapper("a"), appwrapper("b"), pod("a-0", "a", "n1"), pod("b-0", "b", "n2"))
    resetter = make_resetter(dry_run=True)
    api.clear_log()

    with caplog.at_level(logging.INFO, logger="healthd.controller.appwrappers"):
        results = await reconcile(kube, resetter)

    assert results == {f"{NS}/a": "dry-run", f"{NS}/b": "dry-run"}
    assert api.writes() == []
    assert count(metrics, "dry-run") == 2
    logged = caplog.text
    assert "would reset AppWrapper team-a/a" in logged and "n1 (XID_79)" in logged
    assert "would reset AppWrapper team-a/b" in logged and "n2 (XID_48)" in logged
    assert {stored_aw(api, n)["status"]["phase"] for n in "ab"} == {"Running"}
