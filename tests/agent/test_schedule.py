"""The schedule: which checks run when (config and defaults), first turn at start,
no turn overlapping the previous one of the same job, deep diagnostics only when
configured."""

from __future__ import annotations

import logging

import anyio
import pytest

from healthd.agent.schedule import Job, Schedule, plan_jobs
from healthd.config import Config

pytestmark = pytest.mark.anyio


def jobs_by_name(config: Config) -> dict[str, Job]:
    return {job.name: job for job in plan_jobs(config)}


def test_defaults_group_the_nvml_checks_and_leave_deep_diagnostics_off() -> None:
    jobs = jobs_by_name(Config())
    nvml = "gpus,remapped,recovery,power,pcie,aer,ecc,nvlink,fabric,xid,sxid,rdma"
    assert jobs[nvml].interval_s == 30
    assert jobs["pciebw,pvc,dcgm"].interval_s == 3600
    assert jobs["ping"].interval_s == 300
    assert not any(p.exclusive for job in jobs.values() for p in job.planned)


def test_config_sets_intervals_cron_timeouts_and_disables() -> None:
    config = Config.model_validate({
        "checks": {
            "remapped": {"interval": "5s", "timeout": "2s"},
            "pvc": {"enabled": False},
            "ping": {"cron": "*/10 * * * *"},
        },
        "agent": {"diagnostics": [{"check": "dcgm:3", "cron": "0 3 * * 0"}], "jitter": 0.2},
    })
    jobs = jobs_by_name(config)
    remapped = jobs["remapped"]
    assert (remapped.interval_s, remapped.planned[0].timeout_s, remapped.jitter) == (5, 2, 0.2)
    assert "pvc" not in ",".join(jobs)
    assert jobs["ping"].cron == "*/10 * * * *"
    assert jobs["dcgm:3"].planned[0].exclusive and jobs["dcgm:3"].cron == "0 3 * * 0"
    assert remapped.at_start and not jobs["ping"].at_start and not jobs["dcgm:3"].at_start


def test_a_deep_diagnostic_on_an_interval_waits_for_its_first_interval() -> None:
    config = Config.model_validate(
        {"agent": {"diagnostics": [{"check": "dcgm:3", "interval": "1h"}]}})
    assert not jobs_by_name(config)["dcgm:3"].at_start


async def test_first_turn_at_start_and_no_overlapping_turns() -> None:
    (job,) = [j for j in plan_jobs(Config()) if j.name == "ping"]
    fast = Job(job.planned, interval_s=0.05, jitter=0.0)
    starts: list[float] = []
    running = 0
    overlapped = False

    async def fire(fired: Job) -> None:
        nonlocal running, overlapped
        starts.append(anyio.current_time())
        running += 1
        overlapped |= running > 1
        await anyio.sleep(0.2)
        running -= 1

    begin = anyio.current_time()
    with anyio.move_on_after(0.7):
        await Schedule([fast]).run(fire)
    assert starts and starts[0] - begin < 0.5  # loose: the first turn does not wait
    assert not overlapped
    assert 2 <= len(starts) <= 4  # turns that found the last one running were skipped


async def test_a_failing_turn_does_not_end_the_schedule() -> None:
    (job,) = [j for j in plan_jobs(Config()) if j.name == "ping"]
    turns = 0

    async def fire(fired: Job) -> None:
        nonlocal turns
        turns += 1
        raise RuntimeError("boom")

    with anyio.move_on_after(0.5):
        await Schedule([Job(job.planned, interval_s=0.1)]).run(fire)
    assert turns >= 2


async def test_stopping_logs_no_error_for_a_turn_already_handed_over(
        caplog: pytest.LogCaptureFixture) -> None:
    """A turn the scheduler had handed to the event loop when the agent stops must not
    end up in the log as "Error running job" (an SRE's ERROR alert for nothing)."""
    (job,) = [j for j in plan_jobs(Config()) if j.name == "ping"]

    async def fire(fired: Job) -> None:
        await anyio.sleep(0)

    for _ in range(100):  # stop at any moment of a very fast schedule
        with anyio.move_on_after(0.02):
            await Schedule([Job(job.planned, interval_s=0.001)]).run(fire)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
