"""The agent's /readyz answer, from the schedule's progress.

Ready once every job that runs at start has ended its first turn, and as long as no
periodic job has gone `STALE_TURNS` intervals plus its longest deadline without
ending a turn: past that the scheduler or a round is stuck (e.g. NVML hung in the
driver), though the last published state still looks fresh.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from healthd.agent.schedule import Job

STALE_TURNS = 3


class Readiness:
    """Tracks the schedule's turns; `ready(now)` is the /readyz answer."""

    def __init__(self) -> None:
        self._first_round: set[str] = set()  # jobs whose first turn is still to come
        self._first_round_done = anyio.Event()
        self._turn_ended: dict[str, float] = {}  # periodic job -> when its last turn ended
        self._stale_after_s: dict[str, float] = {}  # periodic job -> allowance

    def start(self, jobs: Sequence[Job], at: float) -> None:
        """The schedule starts `jobs` at `at`: their first round is now due."""
        self._first_round = {job.name for job in jobs if job.at_start}
        if not self._first_round:
            self._first_round_done.set()
        for job in jobs:
            if job.at_start and job.interval_s is not None:
                deadline = max(p.timeout_s for p in job.planned)
                self._stale_after_s[job.name] = STALE_TURNS * job.interval_s + deadline
                self._turn_ended[job.name] = at

    @property
    def first_round(self) -> anyio.Event:
        """Set once every job that runs at start has ended its first turn."""
        return self._first_round_done

    def turn_ended(self, name: str, at: float) -> None:
        """Job `name` ended a turn (run or skipped: it was due) at `at`."""
        self._turn_ended[name] = at
        self._first_round.discard(name)
        if not self._first_round:
            self._first_round_done.set()

    def ready(self, now: float) -> tuple[bool, str]:
        if not self._first_round_done.is_set():
            return False, "the first round of checks has not finished"
        for name, allowance in self._stale_after_s.items():
            ended = self._turn_ended.get(name)
            if ended is not None and now - ended > allowance:
                return False, (f"periodic checks stopped: {name} last ended a turn "
                               f"{now - ended:.0f} s ago (allowed {allowance:.0f} s)")
        return True, "ok"
