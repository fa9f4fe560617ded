"""Rendering check results for a person: one row per check and entity.

Columns: check, entity (GPU index and UUID, peer, storage class), status, finding
codes, measured values, message. A check that could not run at all is one row with
its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from checks.base import CheckResult, EntityStatus, Severity, Value
from checks.snapshot import DRIVER_NOT_FOUND

HEADERS = ("CHECK", "ENTITY", "STATUS", "CODE", "VALUES", "MESSAGE")
_MAX_VALUES = 60
_MAX_MESSAGE = 100


def _format_value(value: Value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def format_values(values: Mapping[str, Value], *, wide: bool = False) -> str:
    text = " ".join(f"{k}={_format_value(v)}" for k, v in values.items())
    return text if wide or len(text) <= _MAX_VALUES else text[: _MAX_VALUES - 1] + "…"


def _entity_name(status: EntityStatus, *, wide: bool = False) -> str:
    entity = status.entity
    if entity.kind == "gpu" and entity.uuid:
        return f"{entity.label} {entity.uuid if wide else entity.uuid[:12]}"
    return entity.label


def _clip(text: str, *, wide: bool = False) -> str:
    text = " ".join(text.split())
    return text if wide or len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


def result_rows(result: CheckResult, *, wide: bool = False) -> list[tuple[str, ...]]:
    """One row per entity; `wide`: full GPU UUIDs, values and messages."""
    if not result.entities:
        return [(result.check, "-", result.status.value, "", "",
                 _clip(result.reason, wide=wide))]
    rows: list[tuple[str, ...]] = []
    for status in result.entities:
        mine = [f for f in result.findings if f.entity == status.entity]
        codes = ",".join(dict.fromkeys(f.code for f in mine))
        message = "; ".join(f.message for f in mine) or status.reason
        rows.append(
            (
                result.check,
                _entity_name(status, wide=wide),
                status.status.value,
                codes,
                format_values(status.values, wide=wide),
                _clip(message, wide=wide),
            )
        )
    return rows


def render_table(rows: Iterable[Sequence[str]], headers: Sequence[str] = HEADERS) -> str:
    """Plain aligned columns, like kubectl's."""
    table = [tuple(headers), *(tuple(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]
    return "\n".join(lines)


def render_results(results: Sequence[CheckResult], *, wide: bool = False) -> str:
    return render_table(row for r in results for row in result_rows(r, wide=wide))


def render_problems(results: Sequence[CheckResult], *, wide: bool = False,
                    cannot_run: Sequence[str] = ()) -> str:
    """The rows a person must look at (anything but PASS and SKIPPED), and a line
    for the checks in `cannot_run` (GPU checks without a driver: UNKNOWN, shown
    without rows); "no problems found" only when there is neither."""
    rows = [
        row
        for r in results
        for row in result_rows(r, wide=wide)
        if row[2] not in (Severity.PASS.value, Severity.SKIPPED.value) or row[3]
    ]
    lines = [render_table(rows)] if rows else []
    if cannot_run:
        lines.append(f"{', '.join(cannot_run)}: {Severity.UNKNOWN.value} "
                     f"({DRIVER_NOT_FOUND}: GPU checks cannot run on this machine)")
    return "\n".join(lines) or "no problems found"
