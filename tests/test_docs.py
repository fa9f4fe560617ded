"""The docs match the code and each other: the README opens with the two quickstart
commands, every bundled machine spec is listed, the agent's metrics table names every
family the agent's metrics module documents, the finding codes table says what the
catalog says, and every relative link in the docs leads to a file and heading that
exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import healthd.agent.metrics
from checks.base import Severity
from checks.catalog import AT_ONCE, DEFAULT_CODES, CodeSpec, default_spec, sxid_spec, xid_spec
from healthd.sim.machine import bundled_specs
from tests.observe.rules import anchors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
# Every Markdown page a reader reaches from the README.
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")),
         ROOT / "dashboards" / "README.md", ROOT / "deploy" / "daemonset" / "README.md"]


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


def prose(markdown: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)


def test_the_readme_opens_with_the_two_quickstart_commands() -> None:
    """`./quickstart demo` and `./quickstart test` are a contract: the first code block,
    before any section."""
    first_block = README.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:]]
    assert [c for c in commands if c] == ["./quickstart demo", "./quickstart test"]
    assert README.index("```") < README.index("\n## ")


def test_every_bundled_spec_is_in_both_spec_tables() -> None:
    development = (DOCS / "development.md").read_text()
    listed = families(table_rows(section(development, "## Simulated machines")))
    spec_doc = families(table_rows((DOCS / "machine-spec.md").read_text()
                                   .split("## Bundled examples")[1]))
    assert set(bundled_specs()) <= listed
    assert set(bundled_specs()) <= spec_doc


def test_the_agent_metrics_table_is_complete_and_well_formed() -> None:
    metrics = (DOCS / "metrics.md").read_text()
    rows = table_rows(section(metrics, "## The agent: HTTP and metrics"))
    assert all(len(row) == 4 and re.fullmatch(r"`[a-z0-9_]+`", row[0]) for row in rows), [
        row for row in rows if len(row) != 4 or not row[0].startswith("`")]
    documented = families(table_rows(healthd.agent.metrics.__doc__ or ""))
    documented.discard("autopilot_health_checks")  # the page describes it above the table
    assert families(rows) == documented


def _raised(spec: CodeSpec) -> str:
    fatal = spec.sticky or spec.severity is Severity.EVICT
    rule = spec.raise_rule
    return "at once" if fatal or rule == AT_ONCE else f"{rule.seen} of {rule.runs} runs"


def _meaning_rows(heading: str) -> dict[str, list[str]]:
    checks_page = (DOCS / "checks.md").read_text()
    return {row[0].strip("`"): row for row in table_rows(section(checks_page, heading))}


def test_the_finding_codes_table_says_what_the_catalog_says() -> None:
    rows = _meaning_rows("## Finding codes")
    assert set(DEFAULT_CODES) <= set(rows), set(DEFAULT_CODES) - set(rows)
    wrong = []
    for code, (_, _check, severity, sticky, raised, meaning) in rows.items():
        spec = default_spec(code)
        if spec is None:
            wrong.append(f"{code}: not a code the catalog knows")
            continue
        said = (severity, sticky, raised, meaning)
        truth = (spec.severity.value, "yes" if spec.sticky else "no", _raised(spec),
                 spec.description)
        if said != truth:
            wrong.append(f"{code}: the page says {said}, the catalog {truth}")
    assert not wrong, wrong


def test_every_xid_with_a_meaning_is_in_the_xid_table_as_the_catalog_says() -> None:
    rows = _meaning_rows("### XIDs")
    unlisted = xid_spec(-1).description  # what any XID without its own entry gets
    meant = {f"XID_{n}" for n in range(1024) if xid_spec(n).description != unlisted}
    assert meant == set(rows), meant ^ set(rows)
    wrong = [code for code, (_, severity, sticky, meaning) in rows.items()
             if (severity, sticky, meaning) != (
                 (spec := xid_spec(int(code.removeprefix("XID_")))).severity.value,
                 "yes" if spec.sticky else "no", spec.description)]
    assert not wrong, wrong


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not ours to check offline
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, broken


def _sxid_list(text: str, after: str) -> set[int]:
    """The SXIDs the page lists in parentheses after `after`: `(11012, 11021-11023)`
    is {11012, 11021, 11022, 11023}."""
    listed = re.search(re.escape(after) + r" \(([\d, -]+)\)", text)
    assert listed, f"no list after {after!r}"
    numbers: set[int] = set()
    for part in listed.group(1).split(","):
        low, _, high = part.strip().partition("-")
        numbers |= set(range(int(low), int(high or low) + 1))
    return numbers


def test_the_sxid_lists_of_the_hgx_page_are_the_catalogs() -> None:
    """Each SXID list in the page's verdict paragraph holds exactly the codes the
    catalogue gives that verdict: a range that also covers a code the catalogue calls
    WARN (19050 among the corrected ones) promises the wrong verdict."""
    text = " ".join((DOCS / "hgx-faults.md").read_text().split())
    said = {"whole fabric": _sxid_list(text, "the always-fatal SXIDs"),
            "port": _sxid_list(text, "the fatal ones"),
            "corrected": _sxid_list(text, "The corrected single-bit ECC SXIDs")}
    meanings = [sxid_spec(n).description for n in range(100_000)]
    truth = {group: {n for n, meaning in enumerate(meanings) if group in meaning}
             for group in said}
    wrong = {group: sorted(said[group] ^ truth[group]) for group in said
             if said[group] != truth[group]}
    assert not wrong, f"listed but not so catalogued, or the reverse: {wrong}"
