"""The fidelity table of docs/machine-spec.md: every behaviour where the simulation and a
real node could differ names the tests that hold them the same, and each of those
tests exists, so a renamed or deleted test cannot leave the table promising a check
that no longer runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "machine-spec.md"
HEADING = "## Where the simulation and a real node could differ"
TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def table_rows() -> list[str]:
    section = DOC.read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| behaviour", "| ---"))]


def test_every_row_names_its_tests_or_says_it_has_none() -> None:
    rows = table_rows()
    assert len(rows) >= 10
    for row in rows:
        assert TEST.search(row) or "none yet" in row, row


def test_every_named_test_exists() -> None:
    named = {m.groups() for row in table_rows() for m in TEST.finditer(row)}
    missing = [f"{path}::{name}" for path, name in sorted(named)
               if not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.M)]
    assert missing == []
