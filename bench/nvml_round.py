"""nvml_round: a full round of the NVML checks, as the agent's schedule runs it.

One round = the agent's `Runner.run_round` over every NVML check (gpus, remapped,
power, pcie, ecc, nvlink, fabric, xid reading the events already queued with window
0, and sxid) on one NVML pass through `NvmlGpuSource` (pynvml in worker threads),
which now reads each GPU's NVLink fabric info too. Timed on the
simulated `healthy-8xh100` machine (the fake NVML library under the real pynvml)
and, when NVML finds a real GPU here, on the real driver too. The first round
(which also initialises NVML) is reported apart. Goal: <= 50 ms per round for 8
GPUs (p99).

    python bench/nvml_round.py            # 300 rounds
    python bench/nvml_round.py --quick    # 30
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import anyio
from common import Goal, main, parser, summary

from checks.base import CheckContext, CheckResult
from checks.snapshot import NvmlGpuSource
from healthd.agent.runner import Runner
from healthd.agent.verdict import Trigger
from healthd.check.plans import Planned, planned_check
from healthd.config import Config
from healthd.sim.node import simulate

NAME = "nvml_round"
NVML_CHECKS = ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "fabric", "xid", "sxid")
GOAL_MS = 50.0


def round_config() -> Config:
    return Config.model_validate({"checks": {"xid": {"params": {"window_s": 0}}}})


async def _ignore(key: str, result: CheckResult, trigger: Trigger) -> None:
    """The runner's consumer: the benchmark keeps only the last round's statuses."""


async def time_rounds(config: Config, expected_gpus: int, planned: list[Planned],
                      rounds: int) -> tuple[float, list[float], dict[str, str]]:
    """(first round ms, later rounds ms, last statuses by check)."""
    gpus = NvmlGpuSource()
    ctx = CheckContext(catalog=config.catalog(), gpus=gpus, expected_gpus=expected_gpus)
    runner = Runner(lambda: ctx, on_result=_ignore)
    samples: list[float] = []
    statuses: dict[str, str] = {}
    try:
        for _ in range(rounds + 1):
            start = time.perf_counter()
            results = await runner.run_round(planned, Trigger.PERIODIC)
            samples.append((time.perf_counter() - start) * 1000)
            statuses = {key: r.status.value for key, r in results.items()}
    finally:
        await gpus.aclose()
    return samples[0], samples[1:], statuses


def plan(config: Config) -> list[Planned]:
    return [planned_check(config, name) for name in NVML_CHECKS]


def simulated(config: Config, rounds: int) -> dict[str, Any]:
    with simulate("healthy-8xh100") as sim:
        gpus = sim.spec.gpus.count
        first, later, statuses = anyio.run(time_rounds, config, gpus, plan(config), rounds)
    return {"gpus": gpus, "first_round_ms": round(first, 3), "round_ms": summary(later),
            "statuses": statuses}


def real(config: Config, rounds: int) -> dict[str, Any]:
    """The same rounds on the real driver; `skipped` says why when there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            gpus = pynvml.nvmlDeviceGetCount()
            model = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if gpus else ""
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no library, no driver, no device: nothing to time
        return {"skipped": f"no real GPU: {exc}"}
    if not gpus:
        return {"skipped": "no real GPU: NVML sees 0 devices"}
    first, later, statuses = anyio.run(time_rounds, config, gpus, plan(config), rounds)
    return {"gpus": gpus, "model": str(model), "first_round_ms": round(first, 3),
            "round_ms": summary(later), "statuses": statuses}


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    rounds = 30 if args.quick else 300
    config = round_config()
    figures: dict[str, Any] = {"checks": list(NVML_CHECKS), "rounds": rounds,
               "simulated_8_gpus": simulated(config, rounds), "real_gpu": real(config, rounds)}
    goals = {"simulated_8_gpus_p99_ms": Goal(figures["simulated_8_gpus"]["round_ms"]["p99"],
                                             GOAL_MS)}
    if "round_ms" in figures["real_gpu"]:
        goals["real_gpu_p99_ms"] = Goal(figures["real_gpu"]["round_ms"]["p99"], GOAL_MS)
    return figures, goals, [
        "one round = Runner.run_round over the NVML checks on one NVML pass "
        "(NvmlGpuSource, pynvml in worker threads); xid reads queued events only",
    ]


if __name__ == "__main__":
    sys.exit(main(NAME, measure, parser(__doc__.splitlines()[0]).parse_args()))
