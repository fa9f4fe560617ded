"""The controller on an API server whose etcd was restored from a backup taken before
a node went EVICT: the backup's objects come back with their older resourceVersions
(the reset AppWrapper `Running` again on the EVICT node, the slack queue without its
lendingLimit), and the restored server's new writes pass the versions the
controller's watches saw before they come back, so resuming them shows nothing of it.
The leader's Lease tells: it reads back older than the leader last wrote it, and
every cache relists. Within one history, nothing is done twice.

Cluster: nodes n1 and n2 with 8 GPUs each, AppWrapper `a` Running with a GPU pod on
n1, `b` with one on n2, the slack queue lending 12 GPUs."""

from __future__ import annotations

import logging

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    NS,
    QUEUE,
    KubeFactory,
    Replica,
    controllers,
    eventually,
    gpu_limit,
    phase,
    product_writes,
    set_verdict,
    settings,
    settled,
    status_writes,
)
from tests.controller.test_end_to_end import seed_cluster
from tests.kube.conftest import churn

pytestmark = pytest.mark.anyio

MOVED_BACK = "history moved back"


def cached_phase(ctl: Replica, name: str) -> str | None:
    term = ctl.controller.term
    aw = term.caches.appwrappers.get(f"{NS}/{name}") if term else None
    return ((aw or {}).get("status") or {}).get("phase")


async def evict_n1(api: ApiEmulator, ctl: Replica) -> None:
    """n1 turns EVICT; the controller resets `a`, lowers the limit and sees its reset."""
    set_verdict(api, "n1", "EVICT", "XID_79")
    await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4"
                     and cached_phase(ctl, "a") == "Resetting")


async def test_a_restored_server_gets_its_reset_and_lending_limit_back(
        api: ApiEmulator, kube_for: KubeFactory, caplog: pytest.LogCaptureFixture) -> None:
    seed_cluster(api)
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await settled(ctl)
        backup = api.snapshot()  # everything PASS, `a` Running, no lendingLimit
        await evict_n1(api, ctl)
        with caplog.at_level(logging.INFO):
            seen = api.resource_version
            api.restore(backup)
            churn(api, past=seen)  # the watches come back past what they saw
            set_verdict(api, "n1", "EVICT", "XID_79")  # its agent publishes again
            assert phase(api, "a") == "Running" and gpu_limit(api) is None

            await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4",
                             within=10)
            await anyio.sleep(0.5)  # more renewals, more events: nothing more to do
    assert len(status_writes(api, "a")) == 2 and status_writes(api, "b") == []
    queue_writes = [r for r in product_writes(api) if r.path.endswith(f"/{QUEUE}")]
    assert len(queue_writes) == 2
    assert sum(MOVED_BACK in r.getMessage() for r in caplog.records) == 1


async def test_restarts_without_a_restore_do_nothing_twice(
        api: ApiEmulator, kube_for: KubeFactory, caplog: pytest.LogCaptureFixture) -> None:
    seed_cluster(api)
    with caplog.at_level(logging.INFO):
        async with controllers(kube_for, settings(), "ctl") as (ctl,):
            await settled(ctl)
            await evict_n1(api, ctl)
            # The API server restarts: every watch breaks and comes back to the same
            # history, a little further on.
            await api.go_away()
            churn(api, past=api.resource_version + 5)
            await api.come_back()
            await anyio.sleep(1)
        async with controllers(kube_for, settings(), "ctl") as (again,):  # a new process
            await settled(again)
    assert len(status_writes(api, "a")) == 1 and status_writes(api, "b") == []
    assert len([r for r in product_writes(api) if r.path.endswith(f"/{QUEUE}")]) == 1
    assert not any(MOVED_BACK in r.getMessage() for r in caplog.records)
