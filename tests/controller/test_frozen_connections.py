"""Every connection the controller has to the API server goes silent at once (no FIN,
no RST) while new connections work: the leader renews its Lease over a fresh
connection (keeping or taking back its leadership, never handing it to nobody for
long), and a node that turns EVICT afterwards still gets its AppWrapper reset.

The client's deadlines are shortened (a 1 s request, a 2 s watch, a 1 s margin) to
keep the test fast; the defaults and the bound they give are in docs/."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from healthd.kube.client import Kube
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.kubeconfig import async_api_client
from healthd.util.times import parse_time
from tests.controller.conftest import (
    appwrapper,
    controllers,
    default_flavor,
    eventually,
    gpu_pod,
    node,
    phase,
    set_verdict,
    settings,
    settled,
    slack_queue,
)
from tests.kube.freezing_proxy import FreezingProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
async def proxy(api: ApiEmulator) -> AsyncIterator[FreezingProxy]:
    async with FreezingProxy(api.host, api.port) as running:
        yield running


def lease(api: ApiEmulator) -> dict[str, Any]:
    return dict((api.get("Lease", "healthd-controller", "healthd-system") or {}).get("spec")
                or {})


async def test_after_a_freeze_the_lease_is_renewed_and_resets_still_happen(
        api: ApiEmulator, proxy: FreezingProxy) -> None:
    api.seed(node("n1"), node("n2"), appwrapper("a"), gpu_pod("a", "n1"),
             default_flavor(), slack_queue())
    kube = Kube(async_api_client(proxy.url, user="ctl"), timeout_s=1, watch_timeout_s=2,
                watch_read_margin_s=1)
    async with kube, controllers(lambda name: kube, settings(), "ctl") as (ctl,):
        await settled(ctl)
        assert proxy.freeze() >= 2  # the Lease's connection and the watches
        frozen_at = time.time()
        await eventually(lambda: lease(api).get("holderIdentity") == "ctl"
                         and (parse_time(lease(api).get("renewTime")) or 0)
                         > frozen_at + 1, 8)
        set_verdict(api, "n1", "EVICT", "XID_79")
        await eventually(lambda: phase(api, "a") == "Resetting", 8)
        assert lease(api)["holderIdentity"] == "ctl"


async def test_a_renew_stuck_on_a_frozen_connection_is_retried_before_the_deadline(
        api: ApiEmulator, proxy: FreezingProxy, caplog: pytest.LogCaptureFixture) -> None:
    """The client's own request deadline (10 s) is longer than the renew deadline
    (4 s): the leader must not wait on the silent connection until the deadline has
    passed and then take its own Lease back, logging a loss that never was."""
    api.seed(node("n1"), default_flavor(), slack_queue())
    kube = Kube(async_api_client(proxy.url, user="ctl"), timeout_s=10)
    config = settings(election={"lease_duration": "6s", "renew_deadline": "4s",
                                "retry_period": "1s"})
    async with kube, controllers(lambda name: kube, config, "ctl") as (ctl,):
        await settled(ctl)
        leading: list[float] = []
        await anyio.sleep(2)  # renews have left a connection idle in the pool
        assert proxy.freeze() >= 6  # the watches of the five caches and that one
        frozen_at = time.time()
        for _ in range(300):  # 6 s: past the renew deadline, every 20 ms
            leading.append(ctl.sample("healthd_controller_leader"))
            await anyio.sleep(0.02)
        assert min(leading) == 1.0
        assert (parse_time(lease(api).get("renewTime")) or 0) > frozen_at + 1
    assert not [r for r in caplog.records if "lost the Lease" in r.getMessage()
                or "could not renew" in r.getMessage()]
