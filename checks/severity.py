"""Severities: what a check concluded, how they order and combine, and their exit codes.

Severity order: PASS < WARN < ERR < EVICT. UNKNOWN ("could not tell") and SKIPPED
("does not apply here") stand outside the order. A module of its own, so that the
catalog (which gives each code its severity) and the check contract (checks.base)
both use it without importing each other in a circle.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Severity(enum.StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    ERR = "ERR"
    EVICT = "EVICT"
    UNKNOWN = "UNKNOWN"
    SKIPPED = "SKIPPED"

    @property
    def ordered(self) -> bool:
        """True for the four severities that have an order."""
        return self in _ORDER

    @property
    def rank(self) -> int:
        """Position in PASS < WARN < ERR < EVICT; -1 for UNKNOWN and SKIPPED."""
        return _ORDER.get(self, -1)

    @property
    def exit_code(self) -> int:
        """Nagios convention: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."""
        return _EXIT_CODES[self]


_ORDER = {Severity.PASS: 0, Severity.WARN: 1, Severity.ERR: 2, Severity.EVICT: 3}
_EXIT_CODES = {
    Severity.PASS: 0,
    Severity.SKIPPED: 0,
    Severity.WARN: 1,
    Severity.ERR: 2,
    Severity.EVICT: 2,
    Severity.UNKNOWN: 3,
}


def worst(severities: Iterable[Severity]) -> Severity:
    """Combine statuses: the worst ordered one wins over UNKNOWN only when it is ERR or
    EVICT (an unknown check may hide a fault, so UNKNOWN outranks PASS and WARN).
    SKIPPED counts only when everything was skipped; nothing at all is PASS."""
    seen = list(severities)
    ordered = [s for s in seen if s.ordered]
    top = max(ordered, key=lambda s: s.rank) if ordered else None
    if top is not None and top.rank >= Severity.ERR.rank:
        return top
    if Severity.UNKNOWN in seen:
        return Severity.UNKNOWN
    if top is not None:
        return top
    return Severity.SKIPPED if seen else Severity.PASS
