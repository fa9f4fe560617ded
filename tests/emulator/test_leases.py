"""Leases carry `kubernetes.aio.leaderelection`: one leader at a time, the holder is
written to the Lease, and a standby takes over after the leader dies."""

from __future__ import annotations

from typing import Any

import anyio
import kubernetes.aio.client as aio_client
import pytest
from kubernetes.aio.leaderelection import electionconfig, leaderelection
from kubernetes.aio.leaderelection.resourcelock.leaselock import LeaseLock

from healthd.sim.apiserver import ApiEmulator
from tests.emulator.kube import Kube, open_kube

pytestmark = pytest.mark.anyio


class _LeaseLock(LeaseLock):
    """kubernetes 37.0.2's aio `LeaseLock.create` passes `pretty=True`, which the
    pydantic-validated API refuses before sending anything: create without it."""

    async def create(self, name: str, namespace: str, election_record: Any) -> bool:
        body = aio_client.V1Lease(metadata=aio_client.V1ObjectMeta(name=name),
                                  spec=self.update_lease(election_record))
        try:
            await self.api_instance.create_namespaced_lease(namespace, body)
        except aio_client.ApiException:
            return False
        return True


def _candidate(kube: Kube, identity: str, leading: anyio.Event) -> leaderelection.LeaderElection:
    async def started() -> None:
        leading.set()

    async def stopped() -> None:
        pass

    lock = _LeaseLock("controller", kube.namespace, identity, kube.client)
    config = electionconfig.Config(lock, lease_duration=2, renew_deadline=1.5,
                                   retry_period=1, onstarted_leading=started,
                                   onstopped_leading=stopped)
    return leaderelection.LeaderElection(config)


async def _holder(kube: Kube) -> str:
    lease = await kube.call("CoordinationV1Api", "read_namespaced_lease", "controller",
                            kube.namespace)
    return str(lease.spec.holder_identity)


async def test_standby_takes_over_when_the_leader_dies(target: ApiEmulator | None) -> None:
    # Async only: the sync leader election reads the global client configuration.
    async with open_kube("async", target) as kube:
        await _election(kube)


async def _election(kube: Kube) -> None:
    first, second = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        leader_scope = anyio.CancelScope()

        async def run_leader() -> None:
            with leader_scope:
                await _candidate(kube, "a", first).run()

        tg.start_soon(run_leader)
        with anyio.fail_after(10):
            await first.wait()
        tg.start_soon(_candidate(kube, "b", second).run)
        await anyio.sleep(1.1)  # b has tried at least once
        assert not second.is_set() and await _holder(kube) == "a"
        leader_scope.cancel()  # the leader dies without releasing the lease
        with anyio.fail_after(10):
            await second.wait()
        assert await _holder(kube) == "b"
        tg.cancel_scope.cancel()
