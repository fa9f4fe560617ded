"""A check carries its own data: a new check with a metric or an event source needs its
module and its registry line, nothing in the agent. A toy check class that declares a
measure and an Autopilot gauge is added to the registry (and nowhere else); the real
agent schedules it, and a scrape shows its gauge family and its
`autopilot_health_checks` series. Another toy check declares NVML's XID events as its
event source: an XID runs it at once, long before its next periodic turn. A third
declares that its findings stand for events: the agent counts them."""

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
    Counted,
    Entity,
    EventRun,
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


class XidCounterCheck(BaseCheck):
    """A check with an event source: its value is how often it has run."""

    NAME: ClassVar[str] = "xidcounter"
    DEFAULT_INTERVAL_S: ClassVar[float] = 3600.0  # one turn at start, the next in an hour
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_node_xidcounter_runs", "Runs of the xidcounter check.", "runs",
                "node"),
    )
    EVENTS: ClassVar[EventRun | None] = EventRun("nvml-xid")
    runs = 0

    async def run(self, ctx: CheckContext) -> CheckResult:
        XidCounterCheck.runs += 1
        builder = ResultBuilder(self.NAME, ctx.catalog)
        builder.seen(Entity.node(ctx.node_name), runs=XidCounterCheck.runs)
        return builder.build()


async def test_a_new_check_with_an_event_source_needs_no_agent_edit(
    api: ApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(checks.REGISTRY, XidCounterCheck.NAME, XidCounterCheck)
    monkeypatch.setattr(XidCounterCheck, "runs", 0)

    def runs() -> float | None:
        return h.metric("healthd_node_xidcounter_runs", node=NODE)

    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: runs() == 1, what="the turn at start")
        h.sim.nvml.emit_xid(3, 79)
        await eventually(lambda: (runs() or 0) > 1, what="a run the XID triggered")
        assert h.metric("healthd_check_runs_total", node=NODE, check="xidcounter",
                        result="PASS") == runs()


class BlipCheck(BaseCheck):
    """A check whose findings stand for events: each run reports 2 blips of code 7."""

    NAME: ClassVar[str] = "blips"
    DEFAULT_INTERVAL_S: ClassVar[float] = 0.2
    COUNTS: ClassVar[tuple[Counted, ...]] = (
        Counted("healthd_node_blip_events_total", "Blips seen, by code.", "blip", "node"),)
    CODES: ClassVar[tuple[str, ...]] = ("PEER_UNREACHABLE",)

    async def run(self, ctx: CheckContext) -> CheckResult:
        builder = ResultBuilder(self.NAME, ctx.catalog)
        builder.finding("PEER_UNREACHABLE", Entity.node(ctx.node_name), "two blips",
                        blip=7, count=2)
        return builder.build()


async def test_a_new_check_with_counted_events_needs_no_agent_edit(
    api: ApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(checks.REGISTRY, BlipCheck.NAME, BlipCheck)

    def blips() -> float:
        return h.metric("healthd_node_blip_events_total", node=NODE, blip="7") or 0.0

    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: blips() >= 4, what="two runs' blips counted")
        runs = h.metric("healthd_check_runs_total", node=NODE, check="blips", result="WARN")
        assert runs is not None and blips() in (2 * runs, 2 * runs + 2)  # a run may land between
