"""The alert rules file and its unit tests, as data: the alerts, and what each promtool
unit-test file expects of them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.observe.dashboards import DASHBOARDS, ROOT

ALERTS = DASHBOARDS / "alerts.yaml"
RULE_TESTS = sorted((DASHBOARDS / "tests").glob("*.yaml"))
RUNBOOK = ROOT / "docs" / "runbook.md"
# Where an alert's runbook_url points: the runbook page as the repository shows it.
RUNBOOK_URL = "https://github.com/healthd/healthd/blob/main/docs/runbook.md"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    labels: dict[str, str]
    annotations: dict[str, str]


def alerts() -> list[Alert]:
    data: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return [Alert(rule["alert"], rule["expr"], rule.get("labels", {}),
                  rule.get("annotations", {}))
            for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def expectations(path: Path) -> list[tuple[str, bool]]:
    """(alert name, expects it to fire) for every alert_rule_test in a unit-test file."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return [(case["alertname"], bool(case.get("exp_alerts")))
            for test in data.get("tests", []) for case in test.get("alert_rule_test", [])]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text (a `#` line inside a fenced
    code block is a shell comment, not a heading)."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    out = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", prose, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug)
    return out
