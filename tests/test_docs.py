"""The README's reference tables match the code: every bundled machine spec is
listed, and the agent's metrics table is well formed and names every family the
agent's metrics module documents."""

from __future__ import annotations

import re
from pathlib import Path

import healthd.agent.metrics
from healthd.sim.machine import bundled_specs

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of any level."""
    start = text.index(heading) + len(heading)
    end = re.search(r"^#", text[start:], re.MULTILINE)
    return text[start:start + end.start()] if end else text[start:]


def table_rows(text: str) -> list[list[str]]:
    """Cells of every table row, header and rule lines excluded."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:] if rows else rows


def families(rows: list[list[str]]) -> set[str]:
    return {row[0].strip("`") for row in rows}


def test_every_bundled_spec_is_in_both_spec_tables() -> None:
    readme = families(table_rows(section(README, "## Simulated machines")))
    docs = families(table_rows((ROOT / "docs" / "machine-spec.md").read_text()
                               .split("## Bundled examples")[1]))
    assert set(bundled_specs()) <= readme
    assert set(bundled_specs()) <= docs


def test_the_agent_metrics_table_is_complete_and_well_formed() -> None:
    rows = table_rows(section(README, "### HTTP and metrics"))
    assert all(len(row) == 4 and re.fullmatch(r"`[a-z0-9_]+`", row[0]) for row in rows), [
        row for row in rows if len(row) != 4 or not row[0].startswith("`")]
    documented = families(table_rows(healthd.agent.metrics.__doc__ or ""))
    documented.discard("autopilot_health_checks")  # the README describes it above the table
    assert families(rows) == documented
