"""Running planned checks for every trigger: shared ones in one round through the
runner, exclusive ones (deep diagnostics) as Jobs (healthd.agent.deepdiag), only
while no pod holds the node's GPUs. The node shows TESTING while a deep run holds
them and leaves it whatever happens; a finished run of a check with a
`labelled_level` (dcgm) leaves its level's label (`<prefix>dcgm.level.N`: pass or
fail, and when), which healthd.agent.health keeps.

Each Job carries what its run is for (healthd.agent.deeprecord): the trigger, and the
request it answers with the results of the request's checks that ran before it. A
stopping agent leaves its Job running and the node TESTING (`DeepDiagnostic.hand_over`);
the next agent follows that Job (`resume`) under the same TESTING.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from checks.base import CheckResult
from healthd.agent.deepdiag import DeepCheck, DeepDiagnostic, Obj
from healthd.agent.deeprecord import Asked, DeepRecord
from healthd.agent.health import NodeHealth
from healthd.agent.runner import Runner
from healthd.agent.verdict import Trigger
from healthd.check.plans import Planned
from healthd.config import Config, check_env
from healthd.kube.errors import KubeError

BusyPods = Callable[[], Awaitable[list[str]]]  # pods holding the GPUs; KubeError: unknown
Outcomes = dict[str, CheckResult | str]  # per check key: its result, or why it did not run


def deep_job_env(config: Config) -> dict[str, str]:
    """What the diagnostic Jobs need from the agent's config: the parameters checks
    read from the environment (`ENV`: the DCGM host engine), where set."""
    out: dict[str, str] = {}
    for var, (name, param) in check_env().items():
        if value := config.check_section(name).params.get(param):
            out[var] = str(value)
    return out


class DeepRuns:
    """Runs planned checks for the schedule and requests (see the module docstring)."""

    def __init__(self, runner: Runner, diag: DeepDiagnostic, health: NodeHealth, *,
                 busy_pods: BusyPods, gpu_count: Callable[[], int]) -> None:
        """`gpu_count`: the GPUs a diagnostic Job reserves (all of the node's)."""
        self.runner, self.diag, self.health = runner, diag, health
        self.busy_pods, self.gpu_count = busy_pods, gpu_count

    async def run_planned(self, planned: Sequence[Planned], trigger: Trigger,
                          asked: Asked | None = None) -> Outcomes:
        """Shared checks in one round, then exclusive ones as Jobs. Returns each key's
        result, or the reason it did not run (an exclusive check on busy GPUs).
        `asked`: the request the run answers, which each Job records."""
        out: Outcomes = {}
        shared = [p for p in planned if not p.exclusive]
        if shared:
            out.update(await self.runner.run_round(shared, trigger))
        exclusive = [p for p in planned if p.exclusive]
        for n, item in enumerate(exclusive):
            record = DeepRecord.of(item.key, trigger, asked=asked, at=self.health.clock(),
                                   done=out, rest=tuple(p.key for p in exclusive[n + 1:]))
            out[item.key] = await self.run(item, trigger, record)
        return out

    async def run(self, item: Planned, trigger: Trigger,
                  record: DeepRecord) -> CheckResult | str:
        """One exclusive check as a Job carrying `record`, if the GPUs are free:
        TESTING while it runs. The result, or why it did not run."""
        if item.key in self.runner.running():  # join it; its owner keeps TESTING
            return await self.runner.run(item.key, item.check, trigger, item.timeout_s)
        try:
            busy = await self.busy_pods()
        except KubeError as exc:
            return f"cannot tell whether the GPUs are free: {exc}"
        if busy:
            return f"GPUs are busy: held by {', '.join(busy)}"
        return await self._testing(item, trigger, DeepCheck(
            item.check, self.diag, item.key, self.gpu_count(), record=record))

    async def resume(self, item: Planned, job: Obj, record: DeepRecord) -> CheckResult:
        """Follow `job`, which an earlier agent created for `record`, to its end under
        TESTING, as `run` would have; its result is judged under the record's trigger."""
        started = record.started(self.health.clock())
        return await self._testing(item, record.run_trigger, DeepCheck(
            item.check, self.diag, item.key, self.gpu_count(), resumed=job, started=started))

    async def _testing(self, item: Planned, trigger: Trigger, deep: DeepCheck) -> CheckResult:
        self.health.start_testing(item.key, item.check.labelled_level)
        try:
            return await self.runner.run(item.key, deep, trigger, deep.timeout_s)
        finally:
            if item.key not in self.diag.left:  # a Job left running keeps the node TESTING
                self.health.end_testing(item.key)
