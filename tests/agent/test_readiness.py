"""What the agent's pod tells Kubernetes and the admin without writing anything:
`/readyz` fails once periodic rounds stop (NVML wedged in the driver: the last
published state still looks fresh, and no write would ever say otherwise) and
recovers when they resume; a check that cannot be used on the node at all (DCGM
without a host engine) is SKIPPED with one Warning Event, not an UNKNOWN per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.agent.readiness import STALE_TURNS
from healthd.config import Config
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import load_machine_spec
from tests.agent.harness import (
    NODE,
    NVML_CHECKS,
    ROUND_S,
    SLOW_CHECKS,
    eventually,
    running_agent,
)

pytestmark = pytest.mark.anyio

DEADLINE_S = 0.5


def config_with(**checks: Any) -> Config:
    """NVML checks every ROUND_S with a short deadline, the slow ones off but `checks`."""
    sections: dict[str, Any] = {name: {"interval": ROUND_S, "timeout": DEADLINE_S}
                                for name in NVML_CHECKS}
    sections.update({name: {"enabled": False} for name in SLOW_CHECKS})
    sections.update(checks)
    return Config.model_validate({
        "checks": sections,
        "agent": {"xid_window_s": 0.05, "jitter": 0.0, "api_timeout_s": 2},
    })


async def test_readyz_stays_ok_without_writes_and_fails_while_rounds_are_stuck(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path, config=config_with()) as h:
        await h.judged()
        api.clear_log()
        await anyio.sleep(2 * (STALE_TURNS * ROUND_S + DEADLINE_S))  # rounds keep ending
        assert await h.scrape("/readyz") == (200, "ok")
        assert api.writes() == []  # knowing it is live costs no write

        h.sim.nvml.hang()
        try:
            stuck = STALE_TURNS * ROUND_S + DEADLINE_S
            await anyio.sleep(stuck / 2)
            assert (await h.scrape("/readyz"))[0] == 200  # a slow round is not a stop
            status, text = 0, ""
            with anyio.move_on_after(stuck + 5):
                while status != 503:
                    status, text = await h.scrape("/readyz")
                    await anyio.sleep(0.05)
            assert status == 503, "readyz kept answering ok while no round ended"
            assert "periodic checks stopped" in text and "gpus" in text
            assert (await h.scrape("/healthz"))[0] == 200  # alive: no restart for this
        finally:
            h.sim.nvml.respond()

        with anyio.move_on_after(5):
            while (await h.scrape("/readyz"))[0] != 200:
                await anyio.sleep(0.05)
        assert await h.scrape("/readyz") == (200, "ok")


async def test_dcgm_without_a_host_engine_is_skipped_with_one_warning_event(
        api: ApiEmulator, tmp_path: Path) -> None:
    machine = load_machine_spec("healthy-8xh100")
    no_engine = machine.model_copy(
        update={"dcgm": machine.dcgm.model_copy(update={"host_engine": "none"})})
    config = config_with(dcgm={"interval": ROUND_S, "params": {"level": 1}})
    async with running_agent(api, tmp_path, spec=no_engine, config=config) as h:
        def skipped_runs() -> float:
            return h.metric("healthd_check_runs_total", node=NODE, check="dcgm",
                            result="SKIPPED") or 0

        await eventually(lambda: skipped_runs() >= 4, what="four dcgm runs")
        told = h.events("CheckUnavailable")
        assert len(told) == 1, [e["message"] for e in told]
        assert told[0]["type"] == "Warning"
        assert "no host engine answers at localhost:5555" in told[0]["message"]
        assert h.metric("healthd_check_status", node=NODE, check="dcgm",
                        status="SKIPPED") == 1
        assert h.metric("healthd_check_status", node=NODE, check="dcgm",
                        status="UNKNOWN") in (0, None)
        assert h.verdict() == "PASS"
