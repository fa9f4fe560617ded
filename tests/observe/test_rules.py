"""The alert rules: `promtool check rules` accepts them, every promtool unit test passes,
every alert has a test where it fires and one where it stays silent, and every alert
carries a summary, a description and a runbook link to a section that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.observe.rules import (
    ALERTS,
    RULE_TESTS,
    RUNBOOK,
    RUNBOOK_URL,
    alerts,
    anchors,
    expectations,
)


def test_promtool_check_rules_accepts_the_alert_file(promtool: str) -> None:
    proc = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout + proc.stderr


@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests_pass(promtool: str, path: Path) -> None:
    proc = subprocess.run([promtool, "test", "rules", path.name], capture_output=True,
                          text=True, timeout=60, cwd=path.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    seen = {(name, fires) for path in RULE_TESTS for name, fires in expectations(path)}
    untested = [f"{a.name} ({what})" for a in alerts() for fires, what in
                ((True, "fires"), (False, "stays silent")) if (a.name, fires) not in seen]
    assert not untested, f"alerts without a promtool unit test that checks it: {untested}"


def test_every_alert_explains_itself_and_links_its_runbook_section() -> None:
    sections = anchors(RUNBOOK.read_text())
    problems = []
    for alert in alerts():
        missing = {"summary", "description", "runbook_url"} - set(alert.annotations)
        if missing:
            problems.append(f"{alert.name}: no {sorted(missing)}")
        page, _, anchor = alert.annotations.get("runbook_url", "").partition("#")
        if page != RUNBOOK_URL:
            problems.append(f"{alert.name}: runbook_url {page!r} is not {RUNBOOK_URL}")
        if anchor not in sections:
            problems.append(f"{alert.name}: runbook_url anchor #{anchor} is not a heading "
                            f"of {RUNBOOK.name}")
        if alert.labels.get("severity") not in ("critical", "warning"):
            problems.append(f"{alert.name}: severity must be critical or warning")
    assert not problems, problems


def test_every_runbook_section_is_an_alert() -> None:
    """The runbook has no section for an alert that no longer exists (a renamed alert
    leaves its old section behind otherwise)."""
    text = RUNBOOK.read_text()
    sections = set(re.findall(r"^## (Healthd\w+)\s*$", text, flags=re.MULTILINE))
    assert sections == {alert.name for alert in alerts()}


AGGREGATION = re.compile(
    r"\b(sum|max|min|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)"
    r"\s*(?:(by|without)\s*\(([^)]*)\))?\s*\(")


def test_every_aggregation_keeps_the_cluster_label() -> None:
    """One Prometheus (or Thanos) over several clusters must alert per cluster."""
    dropped = []
    for alert in alerts():
        for match in AGGREGATION.finditer(alert.expr):
            kind, labels = match.group(2), {s.strip() for s in (match.group(3) or "").split(",")}
            keeps = (kind == "by" and "cluster" in labels) or \
                (kind == "without" and "cluster" not in labels)
            if not keeps:
                dropped.append(f"{alert.name}: {match.group(0)}")
    assert not dropped, f"aggregations that drop `cluster`: {dropped}"
