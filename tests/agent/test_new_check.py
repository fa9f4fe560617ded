"""A check carries its own data: a new check with a metric needs its module and its
registry line, nothing in the agent. A toy check class that declares a measure and an
Autopilot gauge is added to the registry (and nowhere else); the real agent schedules
it, and a scrape shows its gauge family and its `autopilot_health_checks` series."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

import checks
from checks.base import (
    AutopilotGauge,
    BaseCheck,
    CheckContext,
    CheckResult,
    Entity,
    Measure,
    ResultBuilder,
)
from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import NODE, eventually, running_agent

pytestmark = pytest.mark.anyio


class WidgetCheck(BaseCheck):
    """What a newcomer writes: the check, its measure, its Autopilot name, its code."""

    NAME: ClassVar[str] = "widgets"
    DEFAULT_INTERVAL_S: ClassVar[float] = 0.2
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_node_widgets", "Widgets the node counts.", "widgets", "node"),
    )
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("widget-check", per="node")
    CODES: ClassVar[tuple[str, ...]] = ("PEER_UNREACHABLE",)

    async def run(self, ctx: CheckContext) -> CheckResult:
        builder = ResultBuilder(self.NAME, ctx.catalog)
        builder.seen(Entity.node(ctx.node_name), widgets=7)
        return builder.build()


async def test_a_new_check_needs_only_its_module_and_its_registry_line(
    api: ApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(checks.REGISTRY, WidgetCheck.NAME, WidgetCheck)  # its registry line
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.metric("healthd_node_widgets", node=NODE) is not None,
                         what="the widgets gauge")
        assert h.metric("healthd_node_widgets", node=NODE) == 7.0
        autopilot = [(s.labels["deviceid"], s.value) for family in h.agent.registry.collect()
                     for s in family.samples if s.name == "autopilot_health_checks"
                     and s.labels["health"] == "widget-check"]
        assert autopilot == [("", 0.0)]  # one node-wide series, judged fine: Autopilot's 0
        status, text = await h.scrape()
        assert status == 200
        assert "# HELP healthd_node_widgets Widgets the node counts." in text
