"""Event runs: a check that declares an event source (`EVENTS`, checks.base.EventRun)
runs at once when the source has something, besides its schedule, so a fault reaches
the label in seconds. One loop per enabled check that declares one, by source:

- "nvml-xid": every XID event NVML delivers triggers a run (listening for 0 s: the
  event is already queued). A burst makes one run: an event the previous run
  already reported is not run for again, and a run that missed its event (it joined
  a run whose window had closed) is followed by one that drains it. Once the node
  has a verdict, the time from the event to the label is measured;
- "kernel-log": a new line of the declared kind in the kernel log triggers a run
  (NVML has no event for NVSwitch errors). Lines of other kinds are left to their
  own consumers: a run for a line NVML already delivered would count as a clean run.

The agent's periodic runs of a check whose runs listen (`listen`) listen for
`agent.xid_window_s` unless the config says otherwise (`effective_config`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

import checks
from checks.base import CheckResult, EventRun
from checks.kernel_log import KernelLog, LogUnavailable
from checks.probes import Probes
from checks.snapshot import NvmlGpuSource, XidEvent
from healthd.check.plans import Planned, planned_check
from healthd.config import Config

log = logging.getLogger(__name__)

KERNEL_LOG_POLL_S = 1.0  # a kernel log that is a regular file (simulation) is polled
KERNEL_LOG_RETRY_S = 60.0  # after the log could not be read


@dataclass(frozen=True)
class Feeds:
    """What event loops listen to and act through."""

    gpus: NvmlGpuSource
    kernel_log: KernelLog | None  # None: no kernel log to follow
    run: Callable[[Planned], Awaitable[CheckResult]]  # an event run of one check
    label_shown: Callable[[float], Coroutine[Any, Any, None]]  # fault-to-label from then


Activity = Callable[[], Coroutine[Any, Any, None]]  # a task of the agent's task group
Loop = Callable[[Planned, EventRun, Feeds], Coroutine[Any, Any, None]]


def effective_config(config: Config) -> Config:
    """`config` with each check whose runs listen for events listening for
    `agent.xid_window_s` per periodic run, unless its params say otherwise."""
    for name, events in _declared():
        if events.listen and events.listen not in config.check_section(name).params:
            config = with_params(config, name, {events.listen: config.agent.xid_window_s})
    return config


def with_params(config: Config, name: str, params: dict[str, Any]) -> Config:
    """`config` with check `name`'s params updated by `params`."""
    section = config.check_section(name)
    updated = section.model_copy(update={"params": {**section.params, **params}})
    return config.model_copy(update={"checks": {**config.checks, name: updated}})


def event_loops(config: Config, feeds: Feeds, probes: Probes) -> list[Activity]:
    """One loop per enabled check that declares an event source, built with `probes`."""
    loops: list[Activity] = []
    for name, events in _declared():
        if not config.check_section(name).enabled:
            continue
        planned = _event_planned(config, name, events, probes)
        loops.append(partial(SOURCES[events.source], planned, events, feeds))
    return loops


def _declared() -> list[tuple[str, EventRun]]:
    """(check name, its EventRun) for each registered check that declares one."""
    return [(name, cls.EVENTS) for name, cls in checks.REGISTRY.items()
            if cls.EVENTS is not None]


def _event_planned(config: Config, name: str, events: EventRun, probes: Probes) -> Planned:
    """Check `name` as an event runs it: not listening, the event is already queued."""
    if events.listen:
        config = with_params(config, name, {events.listen: 0.0})
    return planned_check(config, name, probes=probes)


async def follow_xids(planned: Planned, events: EventRun, feeds: Feeds) -> None:
    """Run the check for each XID event NVML delivers (see the module docstring)."""
    last: CheckResult | None = None
    async with anyio.create_task_group() as measuring:
        async for event in feeds.gpus.watch_xids():
            log.info("XID %d on GPU %d", event.xid, event.gpu_index)
            if last is not None and _covers(last, event):
                continue  # a burst: the run for an earlier event drained this one too
            last = result = await feeds.run(planned)
            if not _reports(result, event):
                # It joined a run whose window had closed: this run drains the event.
                last = result = await feeds.run(planned)
            if _reports(result, event):
                measuring.start_soon(feeds.label_shown, event.at)


async def follow_kernel_log(planned: Planned, events: EventRun, feeds: Feeds) -> None:
    """Run the check as soon as the kernel log holds a line of its kind."""
    kernel_log, kind = feeds.kernel_log, events.lines
    if kernel_log is None or kind is None:
        return  # no log to follow (periodic runs report why), or no kind to look for
    while True:
        try:
            await kernel_log.wait(KERNEL_LOG_POLL_S)
            if await anyio.to_thread.run_sync(kernel_log.pending, kind):
                log.info("%s in the kernel log", kind.upper())
                await feeds.run(planned)
        except (LogUnavailable, OSError):
            await anyio.sleep(KERNEL_LOG_RETRY_S)  # the checks report why


SOURCES: dict[str, Loop] = {"nvml-xid": follow_xids, "kernel-log": follow_kernel_log}


def _reports(result: CheckResult, event: XidEvent) -> bool:
    """Whether a run's result carries `event` (its code on its GPU)."""
    code = f"XID_{event.xid}"
    return any(f.code == code and (f.entity.uuid == event.uuid or
                                   f.entity.index == event.gpu_index)
               for f in result.findings)


def _covers(result: CheckResult, event: XidEvent) -> bool:
    """Whether `result` already accounts for `event`: it reports it and ended after
    the event was received (so it collected it, rather than an earlier one)."""
    return result.started_at + result.duration_s >= event.at and _reports(result, event)
