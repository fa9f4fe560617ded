"""XID events on a running agent, as the Node shows them: a burst of XIDs on several
GPUs is reported in full by the run the first event triggers, and the rest of the
burst does not add empty runs that would count as recovery and release a finding."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, NODE, eventually, fast_config, running_agent

pytestmark = pytest.mark.anyio


def held_codes(health: str) -> set[str]:
    """The codes the node's health annotation shows as held."""
    return {item["code"] for item in json.loads(health)["held"]}


async def test_a_burst_of_xids_is_held_until_periodic_runs_pass(api: ApiEmulator,
                                                               tmp_path: Path) -> None:
    config = fast_config()
    xid = config.checks["xid"].model_copy(update={"interval": 60.0})  # no periodic pass soon
    config = config.model_copy(update={"checks": {**config.checks, "xid": xid}})
    async with running_agent(api, tmp_path, config=config) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        runs = h.metric("healthd_check_runs_total", node=NODE, check="xid", result="PASS")
        h.sim.nvml.emit_xid(5, 79)  # sticky EVICT
        h.sim.nvml.emit_xid(2, 48)  # ERR, released by `recover_after` passing runs
        await eventually(lambda: h.verdict() == "EVICT", what="EVICT label")
        await anyio.sleep(0.5)  # room for the second event's run(s), if any were made
        assert {"XID_79", "XID_48"} <= held_codes(h.annotations()[KEYS.health])
        assert h.metric("healthd_check_runs_total", node=NODE, check="xid",
                        result="PASS") == runs  # no empty run after the burst
