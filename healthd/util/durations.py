"""Durations as people write them in config files and on the command line: `30`,
`30s`, `5m`, `1h`, `250ms`, read as seconds."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> float:
    """Seconds from `30`, `30s`, `5m`, `1h`, `250ms`."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m or 1h")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (m := _DURATION.match(value)):
        return float(m.group(1)) * _UNIT_S[m.group(2)]
    raise ValueError(f"expected a duration like 30s, 5m or 1h, got {value!r}")


MAX_DURATION_S = 366 * 86400.0  # a year: longer is a typo (or .inf), not a schedule
MIN_INTERVAL_S = 0.1  # a check or poll repeated faster would only burn the node's CPU

Duration = Annotated[float, BeforeValidator(parse_duration),
                     Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]
"""A positive, finite duration field of a pydantic model (at most a year), in seconds."""

Interval = Annotated[Duration, Field(ge=MIN_INTERVAL_S)]
"""How often something repeats: a Duration of at least MIN_INTERVAL_S."""
