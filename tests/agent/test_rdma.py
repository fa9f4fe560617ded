"""An RDMA port on a running agent: going down is on the label within one round of
the rdma check, and coming back is damped like every other signal (the label waits
for `recover_after` passing runs and the minimum hold)."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import NODE, eventually, fast_config, running_agent, with_intervals

pytestmark = pytest.mark.anyio
RDMA_ROUND_S = 0.5


async def test_a_port_going_down_is_seen_within_one_round_and_recovers_damped(
        api: ApiEmulator, tmp_path: Path) -> None:
    config = with_intervals(fast_config(min_hold=3), rdma=RDMA_ROUND_S)
    async with running_agent(api, tmp_path, config=config) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        assert h.sim.rdma is not None
        h.sim.rdma.set_port("mlx5_4", state="DOWN", phys_state="Disabled")
        await eventually(lambda: h.verdict() == "ERR", timeout_s=2 * RDMA_ROUND_S + 2,
                         what="ERR label")
        # raised by the first run that saw it, not a second sighting
        assert h.metric("healthd_check_runs_total", node=NODE, check="rdma",
                        result="ERR") == 1
        h.sim.rdma.set_port("mlx5_4")  # the cable is back
        await eventually(lambda: h.metric("healthd_check_status", node=NODE, check="rdma",
                                          status="PASS") == 1, what="a passing rdma run")
        assert h.verdict() == "ERR"  # one pass does not release it
        await eventually(lambda: h.verdict() == "PASS", timeout_s=20 * RDMA_ROUND_S,
                         what="PASS label again")
