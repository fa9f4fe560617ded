"""Rendering the fleet tools' results for a person: tables, ages, the progress line.

Everything here is a pure function of a trigger `Report` or a status document, so
the table and `--output json` are two views of the same data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from healthd.check.report import render_table
from healthd.fleet.trigger import (
    ANSWERED,
    FAILED,
    INTERRUPTED,
    MISSING,
    NO_ANSWER,
    NOT_ASKED,
    OCCUPIED,
    PENDING,
    REFUSED,
    REQUESTED,
    NodeOutcome,
    Report,
)

TRIGGER_HEADERS = ("NODE", "BEFORE", "AFTER", "CHECKS", "DURATION", "ERROR")
TRIGGER_WIDE_HEADERS = ("NODE", "BEFORE", "AFTER", "CHECKS", "DURATION", "WAITED", "ERROR")
STATUS_HEADERS = ("NODE", "VERDICT", "SINCE", "TOP CODES", "FLAPS", "AGENT", "RESTARTS",
                  "BLAMED", "REPAIR", "NOTES")
STATUS_WIDE_HEADERS = (*STATUS_HEADERS, "GPUS", "AGENT POD", "LAST CHANGE")
LENDING_HEADERS = ("QUEUE", "FLAVOR", "RESOURCE", "NOMINAL", "LIMIT", "DUE", "UNAVAILABLE",
                   "BAD NODES")
ERROR_CHARS = 120
NODES_NAMED = 4


def age(seconds: float | None) -> str:
    """kubectl-style ages: `45s`, `3m12s`, `2h5m`, `4d3h`; `-` when unknown."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 and s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60}m" if (s % 3600) // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{(s % 86400) // 3600}h" if (s % 86400) // 3600 else f"{s // 86400}d"


def _clip(text: str, limit: int = ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- trigger ---------------------------------------------------------------------------


def _duration(o: NodeOutcome) -> str:
    if o.duration_s is not None:
        return f"{o.duration_s:.0f}s" if o.duration_s >= 1 or o.waited_s is None \
            else f"{o.waited_s:.1f}s"
    return f"{o.waited_s:.1f}s" if o.waited_s is not None else "-"


def _checks_text(o: NodeOutcome) -> str:
    checks = " ".join(f"{k}={_short_status(v)}" for k, v in o.checks.items())
    return checks or {REQUESTED: "requested", NOT_ASKED: "not asked", REFUSED: "refused",
                      OCCUPIED: "not asked", MISSING: "-",
                      INTERRUPTED: "running"}.get(o.state, "-")


def outcome_row(o: NodeOutcome, *, wide: bool = False) -> tuple[str, ...]:
    """A table row; `wide` adds how long the answer took to come and keeps the whole
    error."""
    row = (o.node, o.before or "-", o.after or "-", _checks_text(o), _duration(o))
    if wide:
        waited = f"{o.waited_s:.1f}s" if o.waited_s is not None else "-"
        return (*row, waited, " ".join(o.problem.split()))
    return (*row, _clip(o.problem))


def answer_line(o: NodeOutcome) -> str:
    """One line per node as its request ends, for output that is not a terminal:
    `gpu-7: WARN (before PASS) pciebw=WARN in 31s`."""
    detail = _clip(o.problem)
    if o.state == ANSWERED and o.accepted:
        text = f"{o.node}: {o.after or '-'} (before {o.before or '-'}) {_checks_text(o)} " \
               f"in {_duration(o)}"
        return text + (f": {detail}" if detail else "")
    if o.state == ANSWERED:
        return f"{o.node}: refused by the agent: {detail}"
    return f"{o.node}: {detail or _group(o, waited=True)}"


def _short_status(text: str) -> str:
    return "NOT-RUN" if text.startswith("NOT RUN") else text


def trigger_table(report: Report, *, wide: bool = False) -> str:
    rows = [outcome_row(o, wide=wide) for o in report.outcomes.values()]
    headers = TRIGGER_WIDE_HEADERS if wide else TRIGGER_HEADERS
    return render_table(rows, headers) + "\n\n" + trigger_summary(report)


def trigger_summary(report: Report) -> str:
    """`20 nodes: 18 PASS, 1 WARN, 1 no agent answered (gpu-7) -> WARN, exit 1`."""
    groups: dict[str, list[str]] = {}
    for o in report.outcomes.values():
        groups.setdefault(_group(o, report.waited), []).append(o.node)
    parts = [f"{len(nodes)} {label}" + (f" ({_names(nodes)})" if _named(label) else "")
             for label, nodes in groups.items()]
    head = f"request {report.plan.text!r} ({report.plan.request_id}) on " \
           f"{plural(len(report.outcomes), 'node')}: "
    tail = f" -> {report.status.value}, exit {report.exit_code}" if report.waited \
        else f"; not waiting for answers, exit {report.exit_code}"
    note = ""
    if report.interrupted:
        note = "\ninterrupted: requests already written still run; see healthd.io/last-run"
    return head + ", ".join(parts) + tail + note


def _group(o: NodeOutcome, waited: bool) -> str:
    if o.state == ANSWERED:
        return o.status.value if o.accepted else "refused by the agent"
    return {NO_ANSWER: "no agent answered", REFUSED: "refused (GPUs busy)",
            OCCUPIED: "another request pending",
            MISSING: "no such node", FAILED: "failed", INTERRUPTED: "interrupted",
            NOT_ASKED: "not asked", REQUESTED: "requested" if not waited else "waiting",
            }.get(o.state, o.state)


def _named(label: str) -> bool:
    return label not in ("PASS", "requested")


def _names(nodes: list[str]) -> str:
    more = len(nodes) - NODES_NAMED
    return ", ".join(nodes[:NODES_NAMED]) + (f" +{more}" if more > 0 else "")


def progress_line(report: Report) -> str:
    """`trigger: 7/20 done, 1 failed, 5 running`, for a terminal's status line."""
    total = len(report.outcomes)
    running = report.count(REQUESTED)
    done = total - running - report.count(PENDING)
    failed = sum(1 for o in report.outcomes.values()
                 if o.state not in (PENDING, REQUESTED) and o.status.exit_code >= 2)
    return f"trigger: {done}/{total} done, {failed} failed, {running} running"


def outcome_json(o: NodeOutcome) -> dict[str, Any]:
    return {"node": o.node, "state": o.state, "status": o.status.value,
            "verdict_before": o.before, "verdict_after": o.after, "accepted": o.accepted,
            "checks": o.checks, "reasons": o.reasons, "error": o.error,
            "duration_s": o.duration_s,
            "waited_s": None if o.waited_s is None else round(o.waited_s, 3)}


def trigger_json(report: Report) -> dict[str, Any]:
    return {"request": report.plan.text, "id": report.plan.request_id,
            "status": report.status.value, "exit_code": report.exit_code,
            "interrupted": report.interrupted, "waited": report.waited,
            "nodes": [outcome_json(o) for o in report.outcomes.values()]}


# -- status ----------------------------------------------------------------------------


def status_text(doc: Mapping[str, Any], *, wide: bool = False) -> str:
    """The status document as tables: nodes, then the controller's view. `wide` adds
    each node's GPUs, agent pod and the last change of a check's status."""
    rows = (_status_row(r) + (_wide_part(r) if wide else ()) for r in doc["nodes"])
    nodes = render_table(rows, STATUS_WIDE_HEADERS if wide else STATUS_HEADERS)
    parts = [nodes if doc["nodes"] else _no_match(doc), _summary_line(doc["summary"]),
             _controller_text(doc["controller"])]
    return "\n\n".join(p for p in parts if p)


def _status_row(row: Mapping[str, Any]) -> tuple[str, ...]:
    notes = [n for n, on in (("cordoned", row["cordoned"]), ("NotReady", row["ready"] is False),
                             ("health unreadable", row.get("health_unreadable")))
             if on]
    return (row["name"], row["verdict"], age(row["since_age_s"]),
            ",".join(row["top_codes"]) or "-", str(row.get("flaps") or "-"),
            _agent_state(row), _restarts(row),
            "yes" if row.get("blamed") else "-", repair_text(row.get("repair")),
            ",".join(notes) or "-")


def repair_text(repair: Mapping[str, Any] | None) -> str:
    """`resetting GPU-9cf5b221 2m`, `reboot-requested 4m`, `hardware-inspection 3h`:
    the state, the GPUs it is about (their UUIDs' first part) and its age; `-` when
    idle."""
    if not repair or not repair.get("state"):
        return "-"
    gpus = ",".join(str(g)[:12] for g in repair.get("gpus") or ())
    return " ".join(p for p in (repair["state"], gpus, age(repair.get("since_age_s"))) if p)


def _agent_state(row: Mapping[str, Any]) -> str:
    """`ready`, `NOT READY` (running, failing its readiness probe), or `NONE`."""
    if not row["agent"]:
        return "NONE"
    return "ready" if row["agent_ready"] else "NOT READY"


def _restarts(row: Mapping[str, Any]) -> str:
    """kubectl's RESTARTS: `0`, `3 (5m ago)`, `-` without a pod."""
    if row["agent_restarts"] is None:
        return "-"
    when = row["agent_restarted_age_s"]
    return str(row["agent_restarts"]) + (f" ({age(when)} ago)" if when is not None else "")


def _wide_part(row: Mapping[str, Any]) -> tuple[str, ...]:
    return (str(row["gpus"]), row["agent_pod"] or "-", age(row["last_round_age_s"]))


def plural(count: int, noun: str) -> str:
    """`1 GPU node`, `3 GPU nodes`."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _no_match(doc: Mapping[str, Any]) -> str:
    """What an empty table means: `no GPU node is EVICT (12 GPU nodes)`."""
    verdicts, total = doc["filters"].get("verdicts"), doc["summary"].get("gpu_nodes")
    of = f" ({plural(total, 'GPU node')})" if total is not None else ""
    if verdicts:
        return f"no GPU node is {' or '.join(verdicts)}{of}"
    return f"no GPU node matches{of}"


def _summary_line(summary: Mapping[str, Any]) -> str:
    counts = ", ".join(f"{n} {v}" for v, n in summary["verdicts"].items() if n)
    missing, unready = summary["without_agent"], summary["agent_not_ready"]
    if not summary["nodes"]:
        return ""
    return (f"{plural(summary['nodes'], 'GPU node')}: {counts or 'none'}"
            + (f"; {missing} without a running agent" if missing else "")
            + (f"; {unready} with an agent that is not ready" if unready else ""))


def _controller_text(view: Mapping[str, Any]) -> str:
    leader = view["leader"]
    who = "no leader" if not leader["holder"] else f"leader {leader['holder']}" + (
        " (lease expired)" if leader["expired"] else "")
    lines = [f"controller: {who}"
             + f"; reset breaker {view['breaker']['state']}"
             + f"; {plural(view['resets_last_hour'], 'AppWrapper reset')} in the last hour"]
    if view["breaker"]["state"] == "open":
        lines.append(f"  breaker: {view['breaker']['message']}")
    lines.extend(f"  reset {r['appwrapper']} at {r['at']}" for r in view["resets"][:5])
    lines.append(_network_text(view["network"]))
    if view["kueue"] is None:
        lines.append("lending: Kueue is not served by this cluster")
    elif view["lending"]:
        lines.append(render_table((_lending_row(r) for r in view["lending"]), LENDING_HEADERS))
    else:
        lines.append("lending: no slack ClusterQueue entry to show")
    lines.extend(f"problem: {p}" for p in view["problems"])
    return "\n".join(lines)


def _network_text(network: Mapping[str, Any]) -> str:
    """`network: 40 nodes report ping; blamed by their peers: gpu-7`, and so on."""
    if not network["reporters"]:
        return "network: no node publishes ping results"
    reporters = network["reporters"]
    parts = [f"network: {plural(reporters, 'node')} report{'s' if reporters == 1 else ''} ping"]
    if network["partitioned"]:
        parts.append(f"PARTITIONED ({network['why']})")
    parts.append(f"blamed by their peers: {_names(network['blamed'])}" if network["blamed"]
                 else "nobody blamed")
    if network["isolated"]:
        parts.append(f"isolated: {_names(network['isolated'])}")
    return "; ".join(parts)


def _lending_row(r: Mapping[str, Any]) -> tuple[str, ...]:
    unavailable = r["unavailable"] + (f" (short {r['shortfall']})"
                                      if r["shortfall"] != "0" else "")
    return (r["queue"], r["flavor"], r["resource"], r["nominal"], r["lending_limit"] or "-",
            r["due"] or "-", unavailable, _names(r["nodes"]) or "-")
