"""`healthd controller` end to end, in process, against the API emulator over HTTP:
a node turning EVICT resets the AppWrapper whose GPU pod runs there and lowers the
slack queue's lendingLimit by the node's GPUs; recovery removes the limit; a
restart with everything right writes nothing; only the leader writes, and a
standby finishes what a dead leader left due without resetting anything twice;
a mass failure opens the circuit breaker and recovery closes it; a dry run writes
nothing but counts its decisions.

Cluster unless a test says otherwise: nodes n1 and n2 with 8 GPUs each, AppWrapper
`a` Running with a GPU pod on n1, `b` with one on n2, the slack queue lending 12
GPUs of flavor `default-flavor`."""

from __future__ import annotations

import anyio
import pytest

from healthd.controller.evictions import EvictionReactor
from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    KubeFactory,
    appwrapper,
    controllers,
    default_flavor,
    events,
    eventually,
    gpu_limit,
    gpu_pod,
    node,
    phase,
    product_writes,
    set_verdict,
    settings,
    settled,
    slack_queue,
    status_writes,
)

pytestmark = pytest.mark.anyio

RESETS = "healthd_controller_resets_total"


def seed_cluster(api: ApiEmulator, *, version: str = "v1beta2",
                 lending_limit: str | None = None) -> None:
    api.seed(node("n1"), node("n2"), appwrapper("a"), appwrapper("b"),
             gpu_pod("a", "n1"), gpu_pod("b", "n2"),
             default_flavor(version), slack_queue(version=version, lending_limit=lending_limit))


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
async def test_an_evict_label_resets_the_appwrapper_and_lowers_the_lending_limit(
        api: ApiEmulator, kube_for: KubeFactory, version: str) -> None:
    if version == "v1beta1":
        api.serve("kueue.x-k8s.io/v1beta2", False)  # an older Kueue
    seed_cluster(api, version=version)
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await settled(ctl)
        assert product_writes(api) == []  # a healthy cluster: nothing to do

        set_verdict(api, "n1", "EVICT", "XID_79")
        took = await eventually(lambda: phase(api, "a") == "Resetting"
                                and gpu_limit(api) == "4")
        assert took < 2
        assert phase(api, "b") == "Running"
        assert len(status_writes(api, "a")) == 1 and status_writes(api, "b") == []
        cond = next(c for c in api.get("AppWrapper", "a", "team-a")["status"]["conditions"]
                    if c["type"] == "Unhealthy")
        assert (cond["status"], cond["reason"]) == ("True", "NodeEvicted")
        assert "n1" in cond["message"] and "XID_79" in cond["message"]
        await eventually(lambda: events(api, "NodeEvicted") and events(api, "AppWrapperReset"))
        assert ctl.sample(RESETS, {"result": "reset"}) == 1
        assert ctl.sample("healthd_controller_label_to_reset_seconds_count") == 1

        set_verdict(api, "n1", "PASS")
        await eventually(lambda: gpu_limit(api) is None)
        assert len(status_writes(api, "a")) == 1


async def test_a_restart_with_everything_right_writes_nothing(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_cluster(api, lending_limit="4")
    api.put(node("n1", "EVICT", codes=("XID_79",)))
    api.put(appwrapper("a", "Resetting"))  # reset by the previous leader
    api.clear_log()
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await settled(ctl)
        await anyio.sleep(0.3)
        assert [(r.path, r.body) for r in product_writes(api)] == []
        assert ctl.sample("healthd_controller_lending_limit",
                          {"queue": "slack-cluster-queue", "flavor": "default-flavor",
                           "resource": "nvidia.com/gpu"}) == 4


async def test_only_the_leader_writes(api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_cluster(api)
    async with controllers(kube_for, settings(), "one", "two") as replicas:
        await eventually(lambda: any(r.controller.leading for r in replicas))
        leader = next(r for r in replicas if r.controller.leading)
        await settled(leader)
        set_verdict(api, "n1", "EVICT")
        await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4")
        await anyio.sleep(0.3)
        writers = {r.user for r in product_writes(api)}
        assert writers == {leader.controller.identity}
        assert sum(r.controller.leading for r in replicas) == 1


async def test_a_standby_finishes_what_a_dead_leader_left_due_without_repeating(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_cluster(api)
    api.seed(appwrapper("c"), gpu_pod("c", "n1"))
    # One reset per minute, one at once: the leader can reset only one of a and c.
    config = settings(resets={"rate_per_minute": 1, "burst": 1})
    async with controllers(kube_for, config, "one", "two") as replicas:
        await eventually(lambda: any(r.controller.leading for r in replicas))
        leader = next(r for r in replicas if r.controller.leading)
        standby = next(r for r in replicas if r is not leader)
        await settled(leader)
        set_verdict(api, "n1", "EVICT")
        await eventually(lambda: len(status_writes(api)) == 1)
        await eventually(lambda: leader.sample(RESETS, {"result": "rate-limited"}) >= 1)

        # The leader dies mid-way: its requests stop, it hands nothing over.
        api.authorizer = lambda user, *rest: user != leader.controller.identity
        leader.stop()
        took = await eventually(lambda: phase(api, "a") == phase(api, "c") == "Resetting",
                                within=4)
        assert took < 1 + 1.5  # the lease, then a sync and a reset
        assert standby.controller.leading
        assert len(status_writes(api, "a")) == 1 and len(status_writes(api, "c")) == 1
        assert phase(api, "b") == "Running"


async def test_a_controller_killed_mid_way_and_restarted_neither_repeats_nor_loses_a_reset(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_cluster(api)
    api.seed(appwrapper("c"), gpu_pod("c", "n1"))
    config = settings(resets={"rate_per_minute": 1, "burst": 1})
    async with controllers(kube_for, config, "ctl") as (first,):
        await settled(first)
        set_verdict(api, "n1", "EVICT")
        await eventually(lambda: first.sample(RESETS, {"result": "rate-limited"}) >= 1)
        # One reset landed, the other is due: kill it there (a write still in flight
        # when the server stops answering would make the story a different one).
        await eventually(lambda: len(status_writes(api)) == 1
                         and first.sample(RESETS, {"result": "reset"}) == 1)
        api.authorizer = lambda *request: False  # killed: nothing more reaches the server
        first.stop()
        await eventually(lambda: not first.controller.leading)
    api.authorizer = None
    assert len(status_writes(api)) == 1
    async with controllers(kube_for, config, "ctl") as (second,):
        await eventually(lambda: phase(api, "a") == phase(api, "c") == "Resetting", within=4)
        await anyio.sleep(0.3)
        assert second.sample(RESETS, {"result": "reset"}) == 1
    assert len(status_writes(api, "a")) == 1 and len(status_writes(api, "c")) == 1


async def test_a_mass_failure_opens_the_breaker_and_recovery_closes_it(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    names = [f"n{i}" for i in range(10)]
    for name in names:
        api.seed(node(name), appwrapper(f"aw-{name}"), gpu_pod(f"aw-{name}", name))
    config = settings(breaker={"max_unhealthy": "30%", "hold": "2s"})
    async with controllers(kube_for, config, "ctl") as (ctl,):
        await settled(ctl)
        for name in names[:4]:  # 40% of the GPU nodes at once: the signal is suspect
            set_verdict(api, name, "EVICT")
        await eventually(lambda: ctl.sample("healthd_controller_breaker_open") == 1)
        await eventually(lambda: events(api, "ResetBreakerOpen"))
        await anyio.sleep(0.3)
        assert status_writes(api) == []
        assert ctl.sample(RESETS, {"result": "breaker-open"}) >= 1

        for name in names[1:4]:  # the fleet recovers; n0 is still EVICT
            set_verdict(api, name, "PASS")
        await anyio.sleep(0.3)
        assert status_writes(api) == []  # the breaker holds for 2 s before it closes
        await eventually(lambda: phase(api, "aw-n0") == "Resetting", within=5)
        assert ctl.sample("healthd_controller_breaker_open") == 0
        assert events(api, "ResetBreakerClosed")
        assert [r.path.split("/")[-2] for r in status_writes(api)] == ["aw-n0"]


async def test_a_dry_run_counts_its_decisions_and_writes_nothing(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_cluster(api)
    api.clear_log()
    async with controllers(kube_for, settings(dry_run=True), "ctl") as (ctl,):
        await settled(ctl)
        set_verdict(api, "n1", "EVICT")
        await eventually(lambda: ctl.sample(RESETS, {"result": "dry-run"}) == 1)
        await eventually(lambda: ctl.sample("healthd_controller_lending_writes_total",
                                            {"queue": "slack-cluster-queue",
                                             "result": "dry-run"}) == 1)
        await anyio.sleep(0.3)
    assert api.writes() == []  # not even a Lease or an Event
    assert phase(api, "a") == "Running" and gpu_limit(api) is None


async def test_a_flapping_label_resets_an_appwrapper_once(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_cluster(api)
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await settled(ctl)
        set_verdict(api, "n1", "EVICT")
        await eventually(lambda: phase(api, "a") == "Resetting")
        # The AppWrapper operator resumes it (on the same node, in this test).
        resumed = api.get("AppWrapper", "a", "team-a")
        resumed["status"]["phase"] = "Running"
        api.put(resumed)
        set_verdict(api, "n1", "PASS")
        set_verdict(api, "n1", "EVICT")
        await eventually(lambda: ctl.sample(RESETS, {"result": "spacing"}) >= 1)
        assert len(status_writes(api, "a")) == 1
        assert phase(api, "a") == "Running"


async def test_a_failing_term_starts_over_and_still_resets(
        api: ApiEmulator, kube_for: KubeFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    seed_cluster(api)
    failures = []
    original = EvictionReactor.run

    async def fails_once(self: EvictionReactor) -> None:
        if not failures:
            failures.append(True)
            raise RuntimeError("a bug")
        await original(self)

    monkeypatch.setattr(EvictionReactor, "run", fails_once)
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        set_verdict(api, "n1", "EVICT")
        await eventually(lambda: phase(api, "a") == "Resetting", within=5)
        assert failures and ctl.controller.leading
