"""One NVML pass per round: every NVML check of a `healthd check` run judges the same
snapshot, so each GPU property is read from NVML exactly once."""

from __future__ import annotations

import anyio

from checks.snapshot import NvmlGpuSource
from healthd.check.once import run_planned
from healthd.check.plans import planned_check
from healthd.config import load_config
from healthd.sim.node import simulate

NVML_CHECKS = ["gpus", "remapped", "power", "pcie", "ecc", "nvlink"]


def test_all_nvml_checks_share_one_pass() -> None:
    config = load_config(None, env={})

    async def main() -> dict[str, int]:
        with simulate("healthy-8xh100") as sim:
            probes = sim.check_probes()
            planned = sim.prepare([planned_check(config, name, probes=probes)
                                   for name in NVML_CHECKS])
            ctx = sim.check_context(config, gpus := NvmlGpuSource())
            results = await run_planned(planned, ctx)
            await gpus.aclose()
            assert [r.status.value for r in results] == ["PASS"] * len(NVML_CHECKS)
            return dict(sim.nvml.library.calls)

    calls = anyio.run(main)
    assert calls["nvmlDeviceGetRemappedRows"] == 8
    assert calls["nvmlDeviceGetPowerUsage"] == 8
    assert calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 8
