"""Checks ready to run: a check key (`remapped`, `dcgm:3`) becomes the configured
check instance with its deadline.

`healthd check`, the agent (its schedule, on-demand requests, XID events) and
`healthd trigger` all plan through here, so a key means the same check everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import checks
from checks.base import Check
from checks.probes import Probes
from healthd.config import Config
from healthd.config.selection import parse_selection


@dataclass(frozen=True)
class Planned:
    """One check instance under its key (`remapped`, `dcgm:3`) with its deadline."""

    key: str
    check: Check
    timeout_s: float

    @property
    def exclusive(self) -> bool:
        return self.check.exclusive


def planned_check(config: Config, key: str, timeout_s: float | None = None, *,
                  probes: Probes | None = None) -> Planned:
    """The check `key` (`remapped`, `dcgm:3`) with its configured params and deadline
    (`timeout_s` when given), measuring with `probes` (None: the real thing).
    ValueError for an unknown check or a bad argument."""
    (selected,) = parse_selection(key, checks.REGISTRY)
    check = config.build_check(selected.name, selected.arg, probes=probes)
    timeout = timeout_s or config.check_section(selected.name).timeout or check.timeout_s
    return Planned(str(selected), check, timeout)
