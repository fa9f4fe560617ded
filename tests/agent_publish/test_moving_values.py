"""A held finding whose measured value moves on every run rewrites nothing: the real
pcie check on a simulated GPU whose PCIe replay counter keeps rising (a different
rise every run, so a different message and values every run) through the verdict
machine and the node publisher, against the API emulator over HTTP."""

from __future__ import annotations

import pytest

from checks.base import CheckResult
from checks.snapshot import NvmlGpuSource
from healthd.agent.verdict import HealthState, Policy, Trigger, apply, initial
from healthd.check.once import run_planned
from healthd.check.plans import planned_check
from healthd.config import load_config
from healthd.sim.machine import MachineSpec
from healthd.sim.node import simulate
from tests.agent_publish.conftest import KEYS, running

pytestmark = pytest.mark.anyio

ROUNDS = 500
REPLAYS = MachineSpec.model_validate({
    "node": "sim-replays",
    "faults": [{"gpu": 2, "pcie_replay_rate": 1_000_000.0}],  # far past the tolerated rise
})


async def test_500_rounds_of_a_held_warn_with_a_moving_value_write_nothing_after_the_first(
        api) -> None:
    config = load_config(None, env={})
    policy = Policy(catalog=config.catalog())
    state: HealthState = initial(0.0)
    messages: set[str] = set()
    with simulate(REPLAYS) as sim:
        planned = sim.prepare([planned_check(config, "pcie", probes=sim.check_probes())])
        ctx = sim.check_context(config, gpus := NvmlGpuSource())
        try:
            async with running(api) as h:
                for n in range(ROUNDS):
                    gpus.new_round()
                    (result,) = await run_planned(planned, ctx)
                    state = apply(state, "pcie", result, trigger=Trigger.PERIODIC,
                                  at=1000.0 + n, policy=policy)
                    await h.published(state)
                    if n == 2:  # a baseline, then two sightings: raised on the third run
                        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "WARN"
                        api.clear_log()
                    messages.update(_replay_messages(result))
                assert h.node_writes() == []
                assert len(h.events()) == 1  # the raise, nothing after
        finally:
            await gpus.aclose()
    assert state.verdict.value == "WARN"
    assert len(messages) > ROUNDS // 2  # the value really moved: a new message most runs


def _replay_messages(result: CheckResult) -> list[str]:
    return [f.message for f in result.findings if f.code == "PCIE_REPLAYS"]
