"""What the shipped Grafana dashboards ask Prometheus: every panel query and template
variable, and the values Grafana would substitute, so tests can run them for real.

Grafana substitutes `$var` / `${var}` with the variable's current value (a multi-value
variable with "All" selected becomes its `allValue`), and its own interval macros
with durations; `Query.variants` yields the expression for every choice of the
single-value variables, as a user flipping through a dropdown would see them.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))
# Grafana's own macros, at values a 6-hour dashboard on a 1 s scrape would get.
MACROS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")

LabelValues = Callable[[str, str | None], list[str]]  # (label, selector) -> values


@dataclass(frozen=True)
class Query:
    """One panel target: where it is, and its PromQL with variables unsubstituted."""

    dashboard: str
    panel: str
    ref: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} [{self.ref}]: {self.expr}"


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str  # datasource, query
    query: str = ""
    multi: bool = False
    all_value: str | None = None


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(path: Path) -> list[Query]:
    dashboard = load(path)
    return [Query(path.stem, panel["title"], target.get("refId", "?"), target["expr"])
            for panel in panels(dashboard) for target in panel.get("targets", [])]


def variables(dashboard: dict[str, Any]) -> list[Variable]:
    out = []
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query", "")
        if isinstance(query, dict):
            query = query.get("query", "")
        all_value = var.get("allValue") if var.get("includeAll") else None
        out.append(Variable(var["name"], var["type"], query, bool(var.get("multi")), all_value))
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with Grafana's macros and `values` in place of `$name` / `${name}`."""
    known = {**MACROS, **values}

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return known.get(name, match.group(0))

    return _VARIABLE.sub(one, expr)


def resolve(var: Variable, chosen: dict[str, str], label_values: LabelValues) -> list[str]:
    """The values a query variable offers once the variables before it are chosen."""
    match = _LABEL_VALUES.match(substitute(var.query, chosen).strip())
    if match is None:
        raise ValueError(f"variable {var.name}: only label_values() queries are supported: "
                         f"{var.query!r}")
    return label_values(match.group("label"), match.group("selector"))


def choices(dashboard: dict[str, Any], label_values: LabelValues) -> list[dict[str, str]]:
    """Every assignment of the dashboard's variables a user can pick: each value of a
    single-value variable, "All" for a multi-value one (its own values when it has no
    allValue). Empty when a variable offers nothing."""
    assignments: list[dict[str, str]] = [{}]
    for var in variables(dashboard):
        if var.kind != "query":
            continue
        grown = []
        for chosen in assignments:
            offered = resolve(var, chosen, label_values)
            if var.multi:
                picks = [var.all_value or "|".join(map(re.escape, offered))] if offered else []
            else:
                picks = offered
            grown.extend({**chosen, var.name: pick} for pick in picks)
        assignments = grown
    return assignments


def variants(query: Query, assignments: list[dict[str, str]]) -> list[str]:
    """The query as Grafana would send it under each assignment (duplicates dropped)."""
    return list(dict.fromkeys(substitute(query.expr, a) for a in assignments or [{}]))


def every_query() -> list[Query]:
    return list(itertools.chain.from_iterable(queries(p) for p in DASHBOARD_FILES))
