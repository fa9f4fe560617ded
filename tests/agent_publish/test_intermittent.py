"""A held finding whose signal comes and goes renders one way: the holding's entity
(its GPU's UUID) and message are the ones it was raised with, whatever the latest run
saw, so the Node is written only when the label's meaning changes. Results with a real
GPU entity (index and UUID, as the NVML pass reports them) go through the real verdict
machine, node view and node publisher, against the API emulator over HTTP; the
emulator's request log counts the writes."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from checks.base import CheckResult, ResultBuilder
from healthd.agent.verdict import HealthState, Policy, Trigger, apply, initial
from tests.agent_publish.conftest import CATALOG, KEYS, gpu, running

pytestmark = pytest.mark.anyio

ROUNDS = 300
WRITES_PER_LABEL_CHANGE = 2  # one metadata patch, one condition patch
# A holding's flap count is part of its meaning (each flap lengthens the hold, and
# `healthd status` shows it); it stops growing at Policy.max_flaps, so it may cost
# that many annotation writes in a whole series, never one per round.
FLAP_WRITES = Policy().max_flaps


def _result(check: str, code: str, present: bool, message: str) -> CheckResult:
    builder = ResultBuilder(check, CATALOG)
    builder.seen(gpu(3))
    if present:
        builder.finding(code, gpu(3), message)
    return builder.build()


async def _writes_and_label_changes(api, readings: list[tuple[bool, str]], check: str,
                                    code: str) -> tuple[int, int, set[str]]:
    """Feed the readings round by round; (Node writes, label changes, condition
    messages seen on the Node)."""
    policy = Policy(catalog=CATALOG)
    state: HealthState = initial(0.0)
    labels: list[str] = ["PASS"]
    messages: set[str] = set()
    async with running(api) as h:
        for n, (present, message) in enumerate(readings, start=1):
            state = apply(state, check, _result(check, code, present, message),
                          trigger=Trigger.PERIODIC, at=1000.0 + n, policy=policy)
            await h.published(state)
            node = h.node()
            labels.append(node["metadata"]["labels"][KEYS.gpuhealth])
            messages.update(c["message"] for c in node["status"]["conditions"]
                            if c["type"] == "GPUUnhealthy" and c["status"] == "False")
        writes = len(h.node_writes())
    changes = sum(a != b for a, b in pairwise(labels))
    return writes, changes, messages


async def test_an_hw_slowdown_seen_one_round_in_ten_writes_only_on_label_changes(api) -> None:
    rng = random.Random(7)
    readings = [(rng.random() < 0.1, f"HW slowdown: SM clock at {1980 - rng.randint(300, 600)}"
                 " MHz") for _ in range(ROUNDS)]
    assert sum(present for present, _ in readings) >= 20  # the signal really blinks
    writes, changes, messages = await _writes_and_label_changes(api, readings, "power",
                                                                "HW_SLOWDOWN")
    assert changes >= 1  # held WARN at some point
    # The first round writes the first verdict (label and condition); after that, only
    # a label change may write the Node.
    assert writes <= WRITES_PER_LABEL_CHANGE * (changes + 1) + FLAP_WRITES
    held = [m for m in messages if m.startswith("GPU 3")]
    assert held and all(gpu(3).uuid in m for m in held)  # never "GPU 3: ..." without it


async def test_a_replay_rise_around_its_threshold_every_round_writes_only_on_label_changes(
        api) -> None:
    rng = random.Random(11)
    tolerated = 8  # the pcie check's default max_replay_rise
    readings = []
    for _ in range(ROUNDS):
        rise = tolerated + 1 + int(rng.gauss(0, 1.5))
        readings.append((rise > tolerated, f"PCIe replay counter rose by {rise} since the last "
                         f"run (tolerated {tolerated})"))
    assert 0 < sum(present for present, _ in readings) < ROUNDS  # above, mostly
    writes, changes, _ = await _writes_and_label_changes(api, readings, "pcie", "PCIE_REPLAYS")
    assert changes >= 1
    assert writes <= WRITES_PER_LABEL_CHANGE * (changes + 1) + FLAP_WRITES
