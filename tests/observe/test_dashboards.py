"""The Grafana dashboards as files: current schema, a Prometheus datasource variable
that every panel uses, node (and GPU) variables from label_values, every variable a
query uses defined, a layout without overlaps, and every panel listed in the
dashboards README."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.observe.dashboards import (
    DASHBOARD_FILES,
    DASHBOARDS,
    MACROS,
    load,
    panels,
    queries,
    variables,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
NEEDS_GPU_VARIABLE = {"node-drilldown"}


def test_the_three_dashboards_are_shipped() -> None:
    assert {p.stem for p in DASHBOARD_FILES} == {"fleet-health", "node-drilldown",
                                                 "remediation"}
    assert len({load(p)["uid"] for p in DASHBOARD_FILES}) == len(DASHBOARD_FILES)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_current_schema_with_datasource_node_and_gpu_variables(path: Path) -> None:
    dashboard = load(path)
    assert dashboard["schemaVersion"] >= 39
    found = {v.name: v for v in variables(dashboard)}
    assert found["datasource"].kind == "datasource"
    assert dashboard["templating"]["list"][0]["query"] == "prometheus"
    assert found["node"].query.startswith("label_values(")
    if path.stem in NEEDS_GPU_VARIABLE:
        assert found["gpu"].query.startswith("label_values(")


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_panel_queries_the_chosen_datasource(path: Path) -> None:
    wrong = []
    for panel in panels(load(path)):
        if panel["type"] == "row":
            continue
        targets = panel.get("targets", [])
        if not targets or panel.get("datasource") != DATASOURCE:
            wrong.append(panel["title"])
        wrong += [f"{panel['title']} [{t.get('refId')}]" for t in targets
                  if t.get("datasource") != DATASOURCE or not t.get("expr")]
    assert not wrong, f"panels without a query on ${{datasource}}: {wrong}"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_variable_a_query_uses_is_defined(path: Path) -> None:
    defined = {v.name for v in variables(load(path))} | set(MACROS)
    undefined = [f"{q.panel}: ${name}" for q in queries(path)
                 for name in re.findall(r"\$\{?(\w+)", q.expr) if name not in defined]
    assert not undefined


def _cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
    g = panel["gridPos"]
    return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panels_have_unique_ids_and_do_not_overlap(path: Path) -> None:
    every = list(panels(load(path)))
    assert len({p["id"] for p in every}) == len(every)
    taken: set[tuple[int, int]] = set()
    for panel in every:
        cells = _cells(panel)
        assert max(x for x, _ in cells) < 24, panel["title"]
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_the_dashboards_readme_lists_every_panel() -> None:
    readme = (DASHBOARDS / "README.md").read_text()
    unlisted = [f"{p.stem}: {panel['title']}" for p in DASHBOARD_FILES
                for panel in panels(load(p))
                if panel["type"] != "row" and f"**{panel['title']}**" not in readme]
    assert not unlisted, f"panels missing from dashboards/README.md: {unlisted}"
