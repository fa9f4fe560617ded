"""When checks run: the periodic schedule, on APScheduler 3.x.

`plan_jobs(config)` turns the config into `Job`s: every enabled, non-exclusive check
of the registry at its interval (the `checks:` section, else the check's default),
checks that share a schedule grouped into one job (so the 30 s NVML checks make one
round on one NVML pass), plus the deep diagnostics listed in `agent.diagnostics`
(nothing exclusive runs unless configured). Cron expressions are allowed everywhere.

`Schedule.run(fire)` starts an `AsyncIOScheduler` on the running loop: one job per
`Job`, `IntervalTrigger` with jitter (a fraction of the interval, so a fleet does not
beat in step) or `CronTrigger.from_crontab`, first run at start (`Job.at_start`: not
for deep diagnostics, which wait for their schedule), `coalesce=True`,
`max_instances=1`. The scheduler's own job only posts the `Job` into a bounded
stream; `run` starts the work in its own task group, skips a job whose previous run
is still going, and on cancellation shuts the scheduler down and cancels the work.
Every run is thus a child of the agent's task tree: cancellation reaches it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

import checks
from checks.probes import Probes
from healthd.check.plans import Planned, planned_check
from healthd.config import Config

log = logging.getLogger(__name__)
_SETTLE_PASSES = 3  # event-loop passes a turn already handed over needs to finish


@dataclass(frozen=True)
class Job:
    """Checks that run together on one schedule (interval seconds or a crontab)."""

    planned: tuple[Planned, ...]
    interval_s: float | None = None
    cron: str | None = None
    jitter: float = 0.0  # fraction of the interval

    @property
    def name(self) -> str:
        return ",".join(p.key for p in self.planned)

    @property
    def at_start(self) -> bool:
        """Whether the first turn comes at start: interval jobs of shared checks. Deep
        diagnostics wait for their schedule (a fleet-wide restart must not start one
        on every idle node at once)."""
        return self.cron is None and not any(p.exclusive for p in self.planned)

    @property
    def when(self) -> str:
        return f"every {self.interval_s:g}s" if self.cron is None else f"cron {self.cron!r}"

    def trigger(self) -> BaseTrigger:
        if self.cron is not None:
            return CronTrigger.from_crontab(self.cron, timezone=dt.UTC)
        assert self.interval_s is not None
        jitter = self.interval_s * self.jitter or None
        return IntervalTrigger(seconds=self.interval_s, jitter=jitter, timezone=dt.UTC)


def plan_jobs(config: Config, probes: Probes | None = None) -> list[Job]:
    """Every periodic job the config asks for (see the module docstring), its checks
    measuring with `probes` (None: the real thing)."""
    by_schedule: dict[tuple[float | None, str | None], list[Planned]] = {}
    for name, cls in checks.REGISTRY.items():
        section = config.check_section(name)
        if not section.enabled:
            continue
        planned = planned_check(config, name, probes=probes)
        if planned.exclusive:
            continue  # deep diagnostics run only when listed in agent.diagnostics
        when = (None, section.cron) if section.cron else (
            section.interval or cls.DEFAULT_INTERVAL_S, None)
        by_schedule.setdefault(when, []).append(planned)
    jitter = config.agent.jitter
    jobs = [Job(tuple(p), interval, cron, jitter) for (interval, cron), p in by_schedule.items()]
    for entry in config.agent.diagnostics:
        planned = planned_check(config, entry.check, entry.timeout, probes=probes)
        jobs.append(Job((planned,), entry.interval, entry.cron, jitter))
    return jobs


Fire = Callable[[Job], Awaitable[None]]


class Schedule:
    """Runs `Job`s on their triggers until cancelled (see the module docstring)."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.jobs = list(jobs)
        self._running: set[int] = set()

    async def run(self, fire: Fire) -> None:
        send, receive = anyio.create_memory_object_stream[int](max(1, len(self.jobs)))
        scheduler = AsyncIOScheduler(timezone=dt.UTC)
        now = dt.datetime.now(dt.UTC)
        for number, job in enumerate(self.jobs):
            scheduler.add_job(
                _post, job.trigger(), args=(send, number), id=str(number), name=job.name,
                **({"next_run_time": now} if job.at_start else {}),
                coalesce=True, max_instances=1, misfire_grace_time=None,
            )
            log.info("scheduled %s %s", job.name, job.when)
        scheduler.start()
        try:
            async with receive, anyio.create_task_group() as group:
                async for number in receive:
                    if number in self._running:
                        log.info("%s is still running: this turn is skipped",
                                 self.jobs[number].name)
                        continue
                    self._running.add(number)
                    group.start_soon(self._one, fire, number)
        finally:
            await _stop(scheduler)
            send.close()

    async def _one(self, fire: Fire, number: int) -> None:
        try:
            await fire(self.jobs[number])
        except Exception:  # one failed turn must not end the schedule
            log.exception("scheduled run of %s failed", self.jobs[number].name)
        finally:
            self._running.discard(number)


async def _stop(scheduler: AsyncIOScheduler) -> None:
    """Shut the scheduler down without an error in the log: a turn it already handed
    to the event loop is let finish first (shutting down cancels it, and apscheduler
    logs a cancelled job as "Error running job")."""
    scheduler.pause()
    with anyio.CancelScope(shield=True):
        for _ in range(_SETTLE_PASSES):
            await anyio.sleep(0)
    scheduler.shutdown(wait=False)


async def _post(send: MemoryObjectSendStream[int], number: int) -> None:
    """The scheduler's job: hand the turn to `Schedule.run`; drop it if one is queued."""
    with suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
        send.send_nowait(number)
