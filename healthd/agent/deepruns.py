"""Running planned checks for every trigger: shared ones in one round through the
runner, exclusive ones (deep diagnostics) as Jobs (healthd.agent.deepdiag), only
while no pod holds the node's GPUs. The node shows TESTING while a deep run holds
them and leaves it whatever happens; a finished run of a check with a
`labelled_level` (dcgm) leaves its level's label (`<prefix>dcgm.level.N`: pass or
fail, and when), which healthd.agent.health keeps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from checks.base import CheckResult
from healthd.agent.deepdiag import DeepCheck, DeepDiagnostic
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

    async def run_planned(self, planned: Sequence[Planned], trigger: Trigger) -> Outcomes:
        """Shared checks in one round, then exclusive ones as Jobs. Returns each key's
        result, or the reason it did not run (an exclusive check on busy GPUs)."""
        out: Outcomes = {}
        shared = [p for p in planned if not p.exclusive]
        if shared:
            out.update(await self.runner.run_round(shared, trigger))
        for item in planned:
            if item.exclusive:
                out[item.key] = await self.run(item, trigger)
        return out

    async def run(self, item: Planned, trigger: Trigger) -> CheckResult | str:
        """One exclusive check as a Job, if the GPUs are free: TESTING while it runs.
        The result, or why it did not run."""
        if item.key in self.runner.running():  # join it; its owner keeps TESTING
            return await self.runner.run(item.key, item.check, trigger, item.timeout_s)
        try:
            busy = await self.busy_pods()
        except KubeError as exc:
            return f"cannot tell whether the GPUs are free: {exc}"
        if busy:
            return f"GPUs are busy: held by {', '.join(busy)}"
        self.health.start_testing(item.key, item.check.labelled_level)
        deep = DeepCheck(item.check, self.diag, item.key, self.gpu_count())
        try:
            return await self.runner.run(item.key, deep, trigger, deep.timeout_s)
        finally:
            self.health.end_testing(item.key)
