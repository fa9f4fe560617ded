"""Leader election over a Lease on the API emulator: one replica acts, a standby takes
over when the leader dies (within the lease) or stops cleanly (at once), and an API
server that goes away never leaves two replicas acting together.

Each elector runs `on_lead` work that records when it started and stopped acting;
"no double leaders" is checked on those intervals and on the Lease history."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import anyio
import anyio.abc
import pytest

from healthd.controller.election import LeaseElector
from healthd.kube.leases import is_expired
from healthd.kube.watching import Rewinds
from healthd.sim.apiserver import ApiEmulator
from healthd.util.times import rfc3339
from tests.controller.conftest import KubeFactory

pytestmark = pytest.mark.anyio

NAMESPACE = "healthd-system"
LEASE = "healthd-controller"
FAST = {"lease_s": 1, "renew_s": 0.5, "retry_s": 0.1}


@dataclass
class Replica:
    """One candidate and the times it acted (anyio clock)."""

    name: str
    elector: LeaseElector
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    intervals: list[list[float]] = field(default_factory=list)

    @property
    def acting(self) -> bool:
        return bool(self.intervals) and len(self.intervals[-1]) == 1

    async def work(self) -> None:
        self.intervals.append([anyio.current_time()])
        try:
            await anyio.sleep_forever()
        finally:
            self.intervals[-1].append(anyio.current_time())

    async def run(self) -> None:
        with self.scope:
            await self.elector.run(self.work)


@asynccontextmanager
async def replicas(kube_for: KubeFactory, *names: str,
                   **timing: float) -> AsyncIterator[list[Replica]]:
    settings = FAST | timing
    group_replicas = [
        Replica(name, LeaseElector(kube_for(name), name=LEASE, namespace=NAMESPACE,
                                   identity=name, **settings))
        for name in names
    ]
    async with anyio.create_task_group() as group:
        for replica in group_replicas:
            group.start_soon(replica.run)
        yield group_replicas
        group.cancel_scope.cancel()


async def wait_for(condition: Callable[[], bool], within: float) -> float:
    """Seconds it took `condition` to hold; fails the test after `within`."""
    start = anyio.current_time()
    with anyio.fail_after(within):
        while not condition():
            await anyio.sleep(0.02)
    return anyio.current_time() - start


def leaders(group: list[Replica]) -> list[str]:
    return [r.name for r in group if r.acting]


def assert_never_two_acting(group: list[Replica]) -> None:
    spans = sorted((span[0], span[-1] if len(span) == 2 else float("inf"), r.name)
                   for r in group for span in r.intervals)
    for (_, end, before), (start, _, after) in itertools.pairwise(spans):
        assert start >= end, f"{after} acted from {start:.2f} while {before} did until {end:.2f}"


def lease_holder(api: ApiEmulator) -> str:
    lease = api.get("Lease", LEASE, NAMESPACE) or {}
    return str(lease.get("spec", {}).get("holderIdentity") or "")


async def test_of_two_replicas_exactly_one_leads_and_holds_the_lease(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with replicas(kube_for, "a", "b") as group:
        await wait_for(lambda: len(leaders(group)) == 1, within=3)
        await anyio.sleep(1.5)  # several renew periods: still one, the same one
        assert len(leaders(group)) == 1
        assert lease_holder(api) == leaders(group)[0]
    assert_never_two_acting(group)
    lease = api.get("Lease", LEASE, NAMESPACE)
    assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 1


async def test_a_dead_leader_is_replaced_within_the_lease_duration(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with replicas(kube_for, "a", "b") as group:
        await wait_for(lambda: len(leaders(group)) == 1, within=3)
        dead = next(r for r in group if r.acting)
        # The leader's process dies: its requests stop arriving (no release either).
        api.authorizer = lambda user, *rest: user != dead.name
        dead.scope.cancel()
        took = await wait_for(lambda: leaders(group) == [r.name for r in group if r is not dead],
                              within=3)
        assert took <= 1 + 0.5  # lease duration plus a few retry periods
        assert lease_holder(api) != dead.name
    assert_never_two_acting(group)


async def test_a_clean_stop_hands_over_at_once(api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with replicas(kube_for, "a", "b", lease_s=10, renew_s=5) as group:
        await wait_for(lambda: len(leaders(group)) == 1, within=3)
        first = next(r for r in group if r.acting)
        first.scope.cancel()  # SIGTERM: the elector releases the Lease on the way out
        took = await wait_for(lambda: leaders(group) == [r.name for r in group if r is not first],
                              within=3)
        assert took < 1  # a retry period, not the 10 s lease
    assert_never_two_acting(group)


async def test_an_api_outage_never_leaves_two_replicas_acting(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with replicas(kube_for, "a", "b") as group:
        await wait_for(lambda: len(leaders(group)) == 1, within=3)
        api.clear_log()
        await api.go_away()
        # Past the renew deadline the leader stops acting, with nobody able to take over.
        await wait_for(lambda: leaders(group) == [], within=2)
        await anyio.sleep(1.2)
        await api.come_back()
        await wait_for(lambda: len(leaders(group)) == 1, within=4)
        assert lease_holder(api) == leaders(group)[0]
    assert_never_two_acting(group)
    # The Lease history: every write that took the Lease was accepted from one holder.
    takes = [r for r in api.writes("PUT", f".*/leases/{LEASE}") if r.status == 200
             and r.body["spec"]["holderIdentity"] != ""]
    holders = [r.body["spec"]["holderIdentity"] for r in takes]
    assert holders and all(h == r.user for h, r in zip(holders, takes, strict=True))


async def test_a_leader_whose_clock_runs_behind_is_not_taken_over(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    def behind() -> datetime:  # an hour slow: every renewTime it writes looks stale
        return datetime.now(UTC) - timedelta(hours=1)

    slow = Replica("slow", LeaseElector(kube_for("slow"), name=LEASE, namespace=NAMESPACE,
                                        identity="slow", clock=behind, **FAST))
    async with anyio.create_task_group() as group:
        group.start_soon(slow.run)
        await wait_for(lambda: slow.acting, within=3)
        async with replicas(kube_for, "other") as (other,):
            await anyio.sleep(2.2)  # more than two lease durations
            assert slow.acting and not other.acting
        group.cancel_scope.cancel()


def renewals(api: ApiEmulator) -> int:
    return len([r for r in api.writes("PUT", f".*/leases/{LEASE}") if r.status == 200])


async def renewed(api: ApiEmulator, times: int) -> None:
    """Until the leader has renewed the Lease `times` more times."""
    target = renewals(api) + times
    await wait_for(lambda: renewals(api) >= target, within=3)


async def test_a_lease_restored_to_an_older_version_is_noticed_once(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    rewinds = Rewinds()
    leader = Replica("a", LeaseElector(kube_for("a"), name=LEASE, namespace=NAMESPACE,
                                       identity="a", rewinds=rewinds, **FAST))
    async with anyio.create_task_group() as group:
        group.start_soon(leader.run)
        await wait_for(lambda: leader.acting, within=3)
        # Someone else writes the Lease (newer): the renewal meets a conflict, not a rewind.
        lease = api.get("Lease", LEASE, NAMESPACE) or {}
        lease["metadata"].setdefault("annotations", {})["example.com/note"] = "seen"
        api.put(lease)
        backup = api.snapshot()
        await renewed(api, 3)
        assert rewinds.count == 0

        api.restore(backup)  # etcd restored: the Lease goes back to an older version
        await wait_for(lambda: rewinds.count == 1, within=3)
        await renewed(api, 3)
        assert rewinds.count == 1 and leader.acting and lease_holder(api) == "a"
        group.cancel_scope.cancel()


def test_a_status_report_judges_a_lease_by_its_renew_time() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    held = {"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15,
                     "renewTime": rfc3339((now - timedelta(seconds=5)).timestamp(), digits=6)}}
    stale = {"spec": {**held["spec"],
                      "renewTime": rfc3339((now - timedelta(seconds=16)).timestamp(), digits=6)}}
    assert not is_expired(held, now.timestamp())
    assert is_expired(stale, now.timestamp())
    assert is_expired({"spec": {"holderIdentity": ""}}, now.timestamp())
    assert is_expired({"spec": {"holderIdentity": "a", "renewTime": "garbage"}}, now.timestamp())


def test_timings_that_allow_two_leaders_are_refused() -> None:
    with pytest.raises(ValueError, match="renew_s < lease_s"):
        LeaseElector(None, name="x", namespace="y", identity="z",  # type: ignore[arg-type]
                     lease_s=5, renew_s=5)
