"""The compact result summary a diagnostic pod leaves in its termination message.

A deep diagnostic runs as a Job; the agent learns what it found from the pod's
termination message, which the kubelet caps at 4096 bytes. `healthd check
--termination-log PATH` writes this summary there, and the agent reads it back with
`parse_summary`. The format (JSON, one object)::

    {"node": "n1", "status": "EVICT", "exit_code": 2,
     "checks": [{"check": "dcgm", "status": "EVICT", "reason": "...", "duration_s": 61.2}],
     "findings": [{"check": "dcgm", "code": "DCGM_PCIE", "entity": "gpu/1",
                   "severity": "EVICT", "message": "..."}],
     "truncated": 0}

Findings are listed worst first; when the summary would not fit, messages are
shortened, then the least severe findings are dropped and counted in `truncated`.
Severities on the reading side come from the reader's catalog, so the agent's
configured overrides apply to diagnostics too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checks.base import CheckResult, Entity, Finding, Severity, worst
from checks.catalog import Catalog
from healthd.kube.objects import Unreadable, bounded_json

LIMIT_BYTES = 4096  # the kubelet's termination message limit
_MESSAGE_CHARS = (160, 60, 0)  # message lengths tried, longest first
_REASON_CHARS = 200


class SummaryError(ValueError):
    """A termination message that is not a healthd summary."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def entity_ref(entity: Entity) -> str:
    """`gpu/1`, `node/n1`, `peer/n2`, `storage/fast`: kind and name, reversible."""
    return f"{entity.kind}/{entity.name}"


def parse_entity(ref: str) -> Entity:
    kind, _, name = ref.partition("/")
    if kind not in ("gpu", "node", "peer", "storage") or not name:
        raise SummaryError(f"bad entity {ref!r}")
    if kind == "gpu" and not name.isdigit():
        raise SummaryError(f"bad GPU entity {ref!r}")
    return Entity(kind, name)  # type: ignore[arg-type]


def _finding_rows(results: Sequence[CheckResult], message_chars: int) -> list[dict[str, Any]]:
    pairs = [(r.check, f) for r in results for f in r.findings]
    pairs.sort(key=lambda p: -p[1].severity.rank)
    rows = []
    for check, f in pairs:
        row = {"check": check, "code": f.code, "entity": entity_ref(f.entity),
               "severity": f.severity.value}
        if message_chars:
            row["message"] = _clip(f.message, message_chars)
        rows.append(row)
    return rows


def _encode(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def compact_summary(node: str, results: Sequence[CheckResult], *,
                    limit: int = LIMIT_BYTES) -> str:
    """The summary of a `healthd check` run, at most `limit` bytes of UTF-8."""
    status = worst(r.status for r in results)
    doc: dict[str, Any] = {
        "node": node,
        "status": status.value,
        "exit_code": status.exit_code,
        "checks": [{"check": r.check, "status": r.status.value,
                    "reason": _clip(r.reason, _REASON_CHARS),
                    "duration_s": round(r.duration_s, 3),
                    **({"actionable": True} if r.actionable else {})} for r in results],
        "findings": [],
        "truncated": 0,
    }
    for chars in _MESSAGE_CHARS:
        rows = _finding_rows(results, chars)
        doc["findings"], doc["truncated"] = rows, 0
        if len(_encode(doc).encode()) <= limit:
            return _encode(doc)
    while doc["findings"] and len(_encode(doc).encode()) > limit:
        doc["findings"].pop()
        doc["truncated"] += 1
    for check in doc["checks"]:
        if len(_encode(doc).encode()) > limit:  # pathological: many checks
            check["reason"] = ""
    return _encode(doc)


def write_summary(path: str | Path, node: str, results: Sequence[CheckResult]) -> str:
    """Write the summary to `path`; returns "" or why it could not be written (the
    run's own output and exit code matter more than this file)."""
    try:
        Path(path).write_text(compact_summary(node, results), encoding="utf-8")
    except OSError as exc:
        return f"cannot write the termination log {path}: {exc.strerror or exc}"
    return ""


def _severity(value: Any) -> Severity:
    try:
        return Severity(str(value))
    except ValueError as exc:
        raise SummaryError(f"bad status {value!r}") from exc


def _finding(row: Any, catalog: Catalog) -> Finding:
    if not isinstance(row, dict) or not isinstance(row.get("code"), str):
        raise SummaryError(f"bad finding {row!r}")
    spec = catalog.lookup(row["code"])
    entity = parse_entity(str(row.get("entity", "")))
    return Finding(spec.code, spec.severity, entity, str(row.get("message") or spec.description),
                   spec.sticky)


def parse_summary(text: str, check: str, catalog: Catalog) -> CheckResult:
    """The result of check `check` (a NAME, e.g. `dcgm`) in a summary.

    Findings take their severity from `catalog`; the status is the worst of them, or
    the reported status when there are none. Raises SummaryError on anything else."""
    try:
        doc = bounded_json(text)
    except Unreadable as exc:
        raise SummaryError(f"not JSON: {_clip(text.strip(), 200)!r}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        raise SummaryError("not a healthd summary (no `checks` list)")
    entry = next((c for c in doc["checks"] if isinstance(c, dict) and c.get("check") == check),
                 None)
    if entry is None:
        raise SummaryError(f"the summary has no result for {check!r}")
    listed = doc.get("findings")
    rows: list[Any] = listed if isinstance(listed, list) else []
    findings = tuple(_finding(r, catalog) for r in rows
                     if isinstance(r, dict) and r.get("check") == check)
    reported = _severity(entry.get("status"))
    # Catalog severities decide; a reported UNKNOWN (part of it could not tell) stays.
    kept: list[Severity] = [reported] if reported is Severity.UNKNOWN else []
    status = worst([f.severity for f in findings] + kept) if findings else reported
    reason = str(entry.get("reason") or "")
    if doc.get("truncated"):
        reason = f"{reason} ({doc['truncated']} more findings not reported)".strip()
    duration = entry.get("duration_s")
    return CheckResult(check=check, status=status, findings=findings, reason=reason,
                       duration_s=float(duration) if isinstance(duration, int | float) else 0.0,
                       actionable=status is Severity.SKIPPED and entry.get("actionable") is True)
