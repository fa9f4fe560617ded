"""Timestamps as Kubernetes writes them (RFC 3339, UTC, `Z`), both ways.

Every time healthd writes into an object, a log line or a report goes through
`rfc3339`; every time it reads from an object goes through `parse_time`. Inside the
program, times are epoch seconds (floats).
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(at: float, *, digits: int = 0) -> str:
    """`2025-05-13T19:54:55Z`, with `digits` digits of the second's fraction: 0 for a
    Kubernetes Time, 6 for a MicroTime (`...55.123456Z`), 3 for log lines."""
    stamp = datetime.fromtimestamp(at, UTC)
    whole = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{stamp.strftime('%f')[:digits]}Z" if digits > 0 else f"{whole}Z"


def parse_time(value: object) -> float | None:
    """Epoch seconds from a Kubernetes Time or MicroTime (`2025-05-13T19:54:55Z`,
    `...55.123456Z`); a time without a zone is UTC. None when absent or malformed:
    object fields are anyone's to write."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
