"""Run checks here, once: the engine behind `healthd check`.

Non-exclusive checks run concurrently (they share one NVML snapshot); exclusive ones
(deep diagnostics) run afterwards, one at a time, alone. Each run has its timeout;
a check that raises or times out is UNKNOWN, never a crash.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from checks.base import CheckContext, CheckResult, Severity, run_check, worst
from checks.probes import Probes
from healthd.check.plans import Planned, planned_check
from healthd.config import Config
from healthd.config.selection import Selected


@dataclass
class Report:
    """What one `healthd check` run found."""

    node: str
    results: list[CheckResult] = field(default_factory=list)
    driver_error: str = ""
    simulated: bool = False

    @property
    def status(self) -> Severity:
        return worst(r.status for r in self.results)

    @property
    def exit_code(self) -> int:
        return self.status.exit_code

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "simulated": self.simulated,
            "status": self.status.value,
            "exit_code": self.exit_code,
            "driver_error": self.driver_error,
            "checks": [r.to_json() for r in self.results],
        }


def plan(config: Config, selection: Sequence[Selected],
         probes: Probes | None = None) -> list[Planned]:
    """Instantiate the selected checks with configured params and timeouts, measuring
    with `probes` (None: the real thing)."""
    return [planned_check(config, str(selected), probes=probes) for selected in selection]


async def run_planned(planned: Sequence[Planned], ctx: CheckContext) -> list[CheckResult]:
    """Run shared checks concurrently, then exclusive ones alone; results in plan order."""
    results: dict[int, CheckResult] = {}

    async def one(position: int, item: Planned) -> None:
        results[position] = await run_check(item.check, ctx, item.timeout_s)

    async with anyio.create_task_group() as group:
        for position, item in enumerate(planned):
            if not item.check.exclusive:
                group.start_soon(one, position, item)
    for position, item in enumerate(planned):
        if item.check.exclusive:
            await one(position, item)
    return [results[i] for i in range(len(planned))]


def node_name(config: Config) -> str:
    return config.node_name or socket.gethostname()
