"""The check library: one module per check, listed in the static REGISTRY below.

Knows GPUs, networks and storage; knows nothing of labels, schedules or the agent
(it never imports `healthd`).
"""

from __future__ import annotations

from checks.base import Check

REGISTRY: dict[str, type[Check]] = {}
