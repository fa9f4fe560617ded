"""The real AppWrapper operator beside healthd when a node goes EVICT: how many resets
an AppWrapper goes through, whether they use up its `retryLimit`, and whether
healthd's breaker still holds resets back, with the operator configured as the docs
say (`monitorNodes: false`) and with its own default (`monitorNodes: true`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, eventually
from tests.e2e.mlbatch import (
    PhaseRecorder,
    Workloads,
    appwrapper,
    documented_operator_autopilot,
    tutorial,
)

BREAKER_OPEN = {"breaker": {"max_unhealthy": "0", "min_allowed": 0}}  # one bad node opens it
SETTLE_S = 30.0  # how long after EVICT resets are counted when healthd resets
OPERATOR_SETTLE_S = 80.0  # the operator looks again at a Running AppWrapper every 60 s


@dataclass
class Outcome:
    resets: int  # times the AppWrapper entered Resetting
    retries: int  # its status.resettingCount at the end (counts against retryLimit)
    off_the_bad_node: bool


def _evict_under(healthd: Healthd, *, breaker_open: bool, settle_s: float = SETTLE_S) -> Outcome:
    workloads = Workloads(healthd.client)
    healthd.applier.apply(tutorial())
    healthd.start_fleet("op", 2, **(BREAKER_OPEN if breaker_open else {}))
    name = f"job-{uuid.uuid4().hex[:5]}"
    job = appwrapper(name, "blue", pods=1, gpus_per_pod=4)
    healthd.applier.apply([job])
    eventually(lambda: workloads.phase("blue", name) == "Running"
               and len(workloads.running_nodes("blue", name)) == 1, 120, "the job Running")
    bad = workloads.running_nodes("blue", name)[0]
    recorder = PhaseRecorder(healthd.client, "blue", name)
    try:
        healthd.agents[bad].fault(op="emit_xid", gpu=0, code=79)
        eventually(lambda: healthd.label(bad) == "EVICT", 30, f"EVICT on {bad}")
        time.sleep(settle_s)
        if recorder.resets():
            eventually(lambda: workloads.phase("blue", name) == "Running"
                       and len(workloads.running_nodes("blue", name)) == 1, 90,
                       "the job Running again")
        off = bad not in workloads.running_nodes("blue", name)
        retries = int(workloads.appwrapper("blue", name)["status"].get("resettingCount", 0) or 0)
        return Outcome(recorder.resets(), retries, off)
    finally:
        recorder.stop()
        healthd.applier.delete([job])


def test_documented_operator_config_one_reset_no_retry_used(healthd: Healthd,
                                                             operator: Operator) -> None:
    outcome = _evict_under(healthd, breaker_open=False)
    assert outcome == Outcome(resets=1, retries=0, off_the_bad_node=True)


def test_documented_operator_config_the_breaker_holds_the_reset_back(
        healthd: Healthd, operator: Operator) -> None:
    outcome = _evict_under(healthd, breaker_open=True)
    assert outcome == Outcome(resets=0, retries=0, off_the_bad_node=False)


@pytest.fixture
def default_operator(operator: Operator) -> Iterator[Operator]:
    operator.configure()  # the operator's own defaults: monitorNodes true
    yield operator
    operator.configure(**documented_operator_autopilot())


def test_operator_default_resets_once_even_beside_healthd(healthd: Healthd,
                                                          default_operator: Operator) -> None:
    outcome = _evict_under(healthd, breaker_open=False)
    # Both may see the pod on the EVICT node; the operator's NoExecute reset does not
    # count against retryLimit, and whichever comes first, the pods are gone before
    # the other looks again.
    assert outcome.resets == 1 and outcome.retries == 0 and outcome.off_the_bad_node


def test_operator_default_resets_even_when_healthds_breaker_is_open(
        healthd: Healthd, default_operator: Operator) -> None:
    outcome = _evict_under(healthd, breaker_open=True, settle_s=OPERATOR_SETTLE_S)
    # healthd's breaker cannot hold back the operator's own reset: the reason the docs
    # say monitorNodes: false.
    assert outcome.resets == 1 and outcome.off_the_bad_node
