"""Dashboards and alerts against a real Prometheus scraping real `healthd agent`s and a
real `healthd controller` (scenario.py): every dashboard query, under the variable
values Grafana would offer, and every alert expression returns data; Prometheus loads
the rule file and raises every alert; Autopilot's dashboard query keeps working."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.observe.dashboards import DASHBOARD_FILES, choices, load, queries, variants
from tests.observe.rules import alerts
from tests.observe.scenario import AGENTS, Live, ScenarioError

# An alert whose expression needs a family the agent does not export yet returns
# nothing here for that reason alone; test_stale_check_alert_fires covers it.
NEEDS_FAMILY = {"HealthdCheckStale": "healthd_check_interval_seconds"}
RULE_ROUNDS_S = 10.0


def _silent(live: Live, exprs: list[str], patience_s: float = 0.0) -> str | None:
    """None when some expression returns data, else why not (empty or an error).
    `patience_s`: keep asking that long (an expression true only part of the time,
    such as a stale check between two of its runs)."""
    deadline = time.monotonic() + patience_s
    while True:
        errors = []
        for expr in exprs:
            try:
                if live.prometheus.query(expr):
                    return None
            except ScenarioError as exc:
                errors.append(str(exc))
        if errors or time.monotonic() >= deadline:
            return "; ".join(errors) or "no data"
        time.sleep(0.2)


# Alerts the scenario cannot raise without breaking what the other checks need
# (promtool tests cover them).
NOT_IN_SCENARIO = {
    "HealthdControllerNoLeader": "a leaderless controller would reset nothing",
    "HealthdRepairStuck": "a repair state two hours old",
}


def _exempt(live: Live) -> set[str]:
    missing = {name for name, family in NEEDS_FAMILY.items() if not live.prometheus.query(family)}
    return missing | set(NOT_IN_SCENARIO)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_dashboard_query_returns_data(live: Live, path: Path) -> None:
    assignments = choices(load(path), live.prometheus.label_values)
    assert assignments, "a template variable offers no value"
    empty = []
    for query in queries(path):
        why = _silent(live, variants(query, assignments))
        if why:
            empty.append(f"{query} -> {why}")
    assert not empty, "queries that returned nothing:\n" + "\n".join(empty)


def test_every_alert_expression_returns_data(live: Live) -> None:
    skipped = _exempt(live)
    empty = [f"{a.name}: {a.expr.strip()} -> {why}" for a in alerts()
             if a.name not in skipped and (why := _silent(live, [a.expr], RULE_ROUNDS_S))]
    assert not empty, "alert expressions that returned nothing:\n" + "\n".join(empty)


def test_prometheus_loads_every_alert_and_raises_it(live: Live) -> None:
    assert sorted(live.prometheus.rule_names()) == sorted(a.name for a in alerts())
    expected = {a.name for a in alerts()} - _exempt(live)
    deadline = time.monotonic() + RULE_ROUNDS_S  # rules run every second, apart from scrapes
    while (quiet := expected - set(live.prometheus.alerts())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not quiet, f"alerts neither pending nor firing in the scenario: {sorted(quiet)}"


def test_stale_check_alert_fires(live: Live) -> None:
    if "HealthdCheckStale" in _exempt(live):
        pytest.skip("the agent does not export healthd_check_interval_seconds yet: "
                    "HealthdCheckStale can only use the default intervals (promtool tests it)")
    (stale,) = [a for a in alerts() if a.name == "HealthdCheckStale"]
    # pvc's runs (3 s) outlast its 500 ms interval, so its last run is more than three
    # intervals old for part of every cycle, not at every instant: watch a few cycles.
    deadline = time.monotonic() + RULE_ROUNDS_S
    seen: set[str] = set()
    while "pvc" not in seen and time.monotonic() < deadline:
        seen |= {r["metric"]["check"] for r in live.prometheus.query(stale.expr)}
        time.sleep(0.2)
    assert "pvc" in seen


def test_autopilot_dashboard_query_shows_the_gpu_with_a_pending_remap(live: Live) -> None:
    deadline = time.monotonic() + RULE_ROUNDS_S  # every agent scraped since its first run
    while True:
        samples = live.prometheus.query('autopilot_health_checks{health="remapped"}')
        values = {(s["metric"]["node"], s["metric"]["deviceid"]): s["value"][1]
                  for s in samples}
        if len(values) >= 8 * len(AGENTS) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    assert len(values) == 8 * len(AGENTS)  # 8 GPUs on each agent's node
    assert {k for k, v in values.items() if v == "1"} == {("gpu-node-a", "3")}
