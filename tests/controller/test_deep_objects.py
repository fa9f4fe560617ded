"""An AppWrapper nested thousands of levels deep (its component template is free-form;
the API server stores up to 10,000 levels) costs itself only: the controller skips it
with one warning naming it and a count, and still resets the AppWrapper on an EVICT
node. (Such an object once made every list and watch of AppWrappers fail with a
RecursionError, so the controller restarted its work forever and reset nothing.)

Cluster: nodes n1 and n2 with 8 GPUs each, AppWrapper `a` Running with a GPU pod on
n1, `b` with one on n2, the slack queue; `deep-1` exists before the controller
starts (it comes in a list), `deep-2` is created while it runs (a watch event)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from prometheus_client import CollectorRegistry

from healthd.controller.controller import Controller
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.client import Kube
from healthd.kube.decoding import UndecodableObjects
from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    NS,
    Replica,
    appwrapper,
    default_flavor,
    eventually,
    gpu_limit,
    gpu_pod,
    node,
    phase,
    set_verdict,
    settings,
    settled,
    slack_queue,
)
from tests.deep_json import deep_appwrapper, post

pytestmark = pytest.mark.anyio

AW_PATH = f"/apis/workload.codeflare.dev/v1beta2/namespaces/{NS}/appwrappers"
UNDECODABLE = "healthd_kube_undecodable_objects_total"


@asynccontextmanager
async def controller(api: ApiEmulator) -> AsyncIterator[Replica]:
    """One controller whose client and metrics share a tally of their own."""
    tally = UndecodableObjects()
    async with Kube(api.async_client(user="ctl"), timeout_s=5, undecodable=tally) as kube, \
            anyio.create_task_group() as group:
        replica = Replica(Controller(settings(), kube=kube, identity="ctl",
                                     metrics=ControllerMetrics(CollectorRegistry(), tally)),
                          anyio.CancelScope())

        async def run() -> None:
            with replica.scope:
                await replica.controller.run()

        group.start_soon(run)
        yield replica
        group.cancel_scope.cancel()


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "cannot decode" in r.getMessage()]


async def test_a_deep_appwrapper_is_skipped_and_the_others_are_still_reset(
        api: ApiEmulator, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    api.seed(node("n1"), node("n2"), appwrapper("a"), appwrapper("b"),
             gpu_pod("a", "n1"), gpu_pod("b", "n2"), default_flavor(), slack_queue())
    assert await post(api.url, AW_PATH, deep_appwrapper("deep-1", NS)) == 201
    async with controller(api) as ctl:
        await settled(ctl)
        assert await post(api.url, AW_PATH, deep_appwrapper("deep-2", NS)) == 201
        await eventually(lambda: ctl.sample(UNDECODABLE, {"kind": "appwrappers"}) == 2)

        set_verdict(api, "n1", "EVICT", "XID_79")
        await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4")
        assert phase(api, "b") == "Running"
        assert sorted(ctl.controller.term.caches.appwrappers.keys()) == [f"{NS}/a", f"{NS}/b"]
    messages = told(caplog)
    assert len(messages) == 2, messages  # one per object, however often it is listed
    assert f"{NS}/deep-1" in messages[0] and f"{NS}/deep-2" in messages[1]
    assert not [r for r in caplog.records if r.exc_info]
