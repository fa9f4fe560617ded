"""Finishing the diagnostics an earlier agent left running on the node.

An exclusive diagnostic belongs to the node, not to the agent process: a stopping
agent leaves its Job running (healthd.agent.deepdiag), and one killed has no say. So
when an agent starts, before its first judgement is shown:

1. it lists this node's diagnostic Jobs that it did not create, retrying while the
   API cannot answer; a refusal (RBAC) is logged, and there is nothing to follow;
2. each Job whose record (healthd.agent.deeprecord) names a check this agent has
   holds the node TESTING from the first judgement on; a Job without one cannot be
   finished and is deleted, with a Warning Event;
3. a diagnostic the Node showed running (`testing` in `healthd.io/health`, which the
   node's health resumed) with no Job left has no result: its check is UNKNOWN with
   the reason, a Warning Event says so, and TESTING ends. A node is never left
   TESTING for a run nobody follows;
4. `looked` is set: the agent may show its first judgement;
5. each Job is followed to its end, one after the other (`DeepRuns.resume`: the
   result judged under the trigger that started it, `dcgm.level.N` written, the Job
   deleted), and the request it answers is answered, once, with its id.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from checks.base import CheckResult
from healthd.agent.deepdiag import Obj
from healthd.agent.deeprecord import DeepRecord, Results, read_record
from healthd.agent.deepruns import DeepRuns
from healthd.agent.node_watch import NodeWatch
from healthd.agent.resume import diagnostics_shown
from healthd.agent.verdict import Trigger
from healthd.check.plans import Planned
from healthd.kube.backoff import Backoff, retrying
from healthd.kube.conventions import Keys
from healthd.kube.errors import KubeError
from healthd.kube.objects import name_of
from healthd.published import Undecodable
from healthd.requests import Request

log = logging.getLogger(__name__)

FIND_RETRY_MAX_S = 5.0  # the longest pause between two tries to list the Jobs

Answer = Callable[[Request, float, Results], Awaitable[None]]  # a request, its start, results


class ResumedDiagnostics:
    """Finishes what an earlier agent left running (see the module docstring)."""

    def __init__(self, runs: DeepRuns, *, watch: NodeWatch, plan: Callable[[str], Planned],
                 known: Callable[[str], bool], answer: Answer, keys: Keys) -> None:
        """`plan` gives a check key as configured (ValueError for a bad one), `known`
        says whether this agent has a check, `answer` answers a request."""
        self.runs, self.watch, self.plan, self.known = runs, watch, plan, known
        self.answer, self.keys = answer, keys
        self.looked = anyio.Event()  # set once what to resume is known and held

    async def run(self) -> None:
        """Look once, then follow what was found to its end."""
        await self.watch.seen.wait()
        shown = diagnostics_shown(self.watch.obj or {}, self.keys, known=self.known)
        jobs, why_none = await self._find()
        found: list[tuple[Obj, DeepRecord, Planned]] = []
        for job in jobs:
            if (taken := await self._take(job)) is not None:
                found.append(taken)
        for key in sorted(shown - {item.key for _, _, item in found}):
            await self._lost(key, why_none)
        self.looked.set()
        for job, record, item in found:
            await self._finish(job, record, item)

    async def _find(self) -> tuple[list[Obj], str]:
        """The Jobs left to this agent, and what to say of a diagnostic without one."""
        try:
            jobs = await retrying(self.runs.diag.find, backoff=Backoff(maximum=FIND_RETRY_MAX_S))
        except KubeError as exc:
            log.warning("cannot look for diagnostic Jobs left running: %s", exc)
            return [], f"cannot look for its Job: {exc}"
        return jobs, "its Job is gone (deleted, or removed by its TTL) before its result was read"

    async def _take(self, job: Obj) -> tuple[Obj, DeepRecord, Planned] | None:
        """A Job to follow, held TESTING; None when it cannot be finished (deleted)."""
        record = read_record(job, self.keys)
        if record is None or isinstance(record, Undecodable) or not record.key:
            why = record.why if isinstance(record, Undecodable) else "no check key"
            await self.runs.diag.discard(job, f"has no readable run record ({why})")
            return None
        try:
            item = self.plan(record.key)
        except ValueError as exc:
            await self.runs.diag.discard(job, f"runs a check this agent cannot judge ({exc})")
            return None
        if not item.exclusive:
            await self.runs.diag.discard(job, f"runs {item.key}, which is no diagnostic")
            return None
        log.info("resuming diagnostic %s (Job %s) left running by an earlier agent",
                 item.key, name_of(job))
        self.runs.health.start_testing(item.key, item.check.labelled_level)
        return job, record, item

    async def _lost(self, key: str, why: str) -> None:
        """A diagnostic the Node showed running, with no Job to read: UNKNOWN."""
        log.warning("diagnostic %s the node showed running has no result: %s", key, why)
        await self.runs.diag.warn(key, why)
        result = CheckResult.unknown(key.partition(":")[0], f"no result: {why}")
        await self.runs.runner.on_result(key, result, Trigger.PERIODIC)
        self.runs.health.end_testing(key)

    async def _finish(self, job: Obj, record: DeepRecord, item: Planned) -> None:
        result = await self.runs.resume(item, job, record)
        if record.request is not None:
            await self.answer(record.request, record.started(self.runs.health.clock()),
                              record.results(result))
