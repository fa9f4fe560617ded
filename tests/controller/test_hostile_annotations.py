"""A node whose `healthd.io/health` annotation is garbage (anyone with node-patch
rights can write it): the controller keeps deciding from the verdict label. Garbage
alone resets nothing and moves no lendingLimit; the controller says so once, not on
every event of that node; when the label turns EVICT, with the garbage still there or
after the agent rewrote the annotation, the AppWrapper on it is reset. (A deeply
nested value once made every handler fail with a RecursionError, so the reset never
came.)

Cluster: nodes n1 and n2 with 8 GPUs each, AppWrapper `a` Running with a GPU pod on
n1, `b` with one on n2, the slack queue lending 12 GPUs."""

from __future__ import annotations

import logging

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    KEYS,
    KubeFactory,
    appwrapper,
    controllers,
    default_flavor,
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
)

pytestmark = pytest.mark.anyio

NESTED = "[" * 100_000 + "]" * 100_000  # valid JSON, far deeper than any decoder recurses


def write_health(api: ApiEmulator, name: str, text: str, verdict: str | None = None) -> None:
    stored = api.get("Node", name)
    assert stored is not None
    stored["metadata"].setdefault("annotations", {})[KEYS.health] = text
    if verdict is not None:
        stored["metadata"]["labels"][KEYS.gpuhealth] = verdict
    api.put(stored)


def told(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum(1 for r in caplog.records
               if r.levelno == logging.WARNING and f"node {name}:" in r.getMessage()
               and "cannot be read" in r.getMessage())


@pytest.mark.parametrize("rewritten", [False, True], ids=["garbage-stays", "agent-rewrote"])
async def test_garbage_health_changes_nothing_and_a_later_evict_still_resets(
        api: ApiEmulator, kube_for: KubeFactory, caplog: pytest.LogCaptureFixture,
        rewritten: bool) -> None:
    caplog.set_level(logging.WARNING)
    api.seed(node("n1"), node("n2"), appwrapper("a"), appwrapper("b"),
             gpu_pod("a", "n1"), gpu_pod("b", "n2"), default_flavor(), slack_queue())
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await settled(ctl)
        for _ in range(3):  # three events of the node, garbage each time
            write_health(api, "n1", NESTED)
            await settled(ctl)
        assert product_writes(api) == []  # no reset, no lendingLimit change
        assert phase(api, "a") == "Running" and gpu_limit(api) is None
        assert told(caplog, "n1") == 1 and told(caplog, "n2") == 0
        assert not [r for r in caplog.records if r.exc_info]  # no handler failed

        if rewritten:
            set_verdict(api, "n1", "EVICT", "XID_79")  # the agent's own annotation
        else:
            write_health(api, "n1", NESTED, verdict="EVICT")
        await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4")
        assert phase(api, "b") == "Running"
        assert not [r for r in caplog.records if r.exc_info]
