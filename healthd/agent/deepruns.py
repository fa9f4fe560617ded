"""Deep diagnostics as the agent runs them: an exclusive check runs as a Job
(healthd.agent.deepdiag) only while no pod holds the node's GPUs, the node shows
TESTING meanwhile, and a finished run of a check with a `labelled_level` (dcgm)
leaves its level's label (`<prefix>dcgm.level.N`: pass or fail, and when).

`DeepRuns` reaches the agent only through `DeepHost`: whether the GPUs are free, how
many there are, and the TESTING state.
"""

from __future__ import annotations

from typing import Protocol

from checks.base import CheckResult, Severity
from healthd.agent.deepdiag import DeepCheck, DeepDiagnostic
from healthd.agent.runner import Runner
from healthd.agent.verdict import Trigger
from healthd.check.plans import Planned
from healthd.config import DCGM_HOST_ENGINE_ENV, Config
from healthd.kube.conventions import dcgm_label_value
from healthd.kube.errors import KubeError


class DeepHost(Protocol):
    """The agent as deep runs see it (healthd.agent.agent.Agent implements it)."""

    async def busy_pods(self) -> list[str]:
        """Pods holding the node's GPUs; KubeError when the API cannot tell."""
        ...

    def gpu_count(self) -> int:
        """The GPUs a diagnostic Job reserves: all of the node's."""
        ...

    def start_testing(self, key: str) -> None:
        """The node shows TESTING while check `key` runs."""
        ...

    def end_testing(self, key: str) -> None:
        """Check `key` no longer holds the node in TESTING."""
        ...


def deep_job_env(config: Config) -> dict[str, str]:
    """What the diagnostic Jobs need from the agent's config: its DCGM host engine."""
    host_engine = config.check_section("dcgm").params.get("host_engine")
    return {DCGM_HOST_ENGINE_ENV: str(host_engine)} if host_engine else {}


class DeepRuns:
    """Runs exclusive checks for the agent and keeps the DCGM level labels."""

    def __init__(self, host: DeepHost, runner: Runner, diag: DeepDiagnostic) -> None:
        self.host, self.runner, self.diag = host, runner, diag
        self.dcgm_levels: dict[int, str | None] = {}  # level -> its label value
        self._levels: dict[str, int | None] = {}  # running exclusive key -> DCGM level

    async def run(self, item: Planned, trigger: Trigger) -> CheckResult | str:
        """One exclusive check as a Job, if the GPUs are free: TESTING while it runs.
        The result, or why it did not run."""
        if item.key in self.runner.running():  # join it; its owner keeps TESTING
            return await self.runner.run(item.key, item.check, trigger, item.timeout_s)
        try:
            busy = await self.host.busy_pods()
        except KubeError as exc:
            return f"cannot tell whether the GPUs are free: {exc}"
        if busy:
            return f"GPUs are busy: held by {', '.join(busy)}"
        self._levels[item.key] = item.check.labelled_level
        self.host.start_testing(item.key)
        deep = DeepCheck(item.check, self.diag, item.key, self.host.gpu_count())
        try:
            return await self.runner.run(item.key, deep, trigger, deep.timeout_s)
        finally:
            self._levels.pop(item.key, None)
            self.host.end_testing(item.key)

    def finished(self, key: str, result: CheckResult, at: float) -> bool:
        """Note `result` of check `key`; whether it ends a deep run (the caller ends
        TESTING in the same state, so result and end of TESTING make one write)."""
        if key not in self._levels:
            return False
        level = self._levels[key]
        if level is not None and result.status.ordered:
            passed = result.status.rank < Severity.ERR.rank
            self.dcgm_levels[level] = dcgm_label_value(passed, at)
        return True
