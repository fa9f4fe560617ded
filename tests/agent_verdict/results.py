"""Test helpers: real check results built with `ResultBuilder` and the real catalog,
and a small driver that feeds them to the verdict machine one step at a time."""

from __future__ import annotations

from collections.abc import Iterable

from checks.base import CheckResult, Entity, ResultBuilder
from checks.catalog import Catalog
from healthd.agent import verdict as v
from healthd.kube.conventions import Verdict

CATALOG = Catalog()
GPUS = 4


def run_of(
    check: str,
    *found: tuple[str, int],
    blind: Iterable[int] = (),
    catalog: Catalog = CATALOG,
) -> CheckResult:
    """One run of `check` over GPUS GPUs: `found` = (code, gpu index) findings,
    `blind` = GPUs it could not read (their status is UNKNOWN)."""
    builder = ResultBuilder(check.split(":")[0], catalog)
    for index in range(GPUS):
        builder.seen(Entity.gpu(index))
    for index in blind:
        builder.unknown(Entity.gpu(index), "NVML error")
    for code, index in found:
        builder.finding(code, Entity.gpu(index), f"{code} on gpu{index}")
    return builder.build()


def clean(check: str) -> CheckResult:
    return run_of(check)


def unknown(check: str) -> CheckResult:
    return CheckResult.unknown(check.split(":")[0], "timed out after 10 s")


def skipped(check: str) -> CheckResult:
    return CheckResult.skipped(check.split(":")[0], "no GPU supports it")


class Node:
    """Drives the machine like the agent does: a clock that ticks once per step.
    `min_hold` is 0 unless given, so that each table shows its own rule (release
    counts, doubling, clears); the tables of the minimum hold set it."""

    def __init__(self, recover_after: int = 2, *, catalog: Catalog = CATALOG,
                 max_doublings: int = 5, flap_window: int = 100, min_hold: int = 0) -> None:
        self.policy = v.Policy(recover_after=recover_after, catalog=catalog,
                               max_doublings=max_doublings, flap_window=flap_window,
                               min_hold=min_hold)
        self.now = 100.0
        self.state = v.initial(self.now)

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    def run(
        self, key: str, result: CheckResult, trigger: v.Trigger = v.Trigger.PERIODIC
    ) -> Verdict:
        self.state = v.apply(
            self.state, key, result, trigger=trigger, at=self._tick(), policy=self.policy
        )
        return self.state.verdict

    def hold(self, key: str, result: CheckResult) -> Verdict:
        """Report `result` in two consecutive runs: enough to raise any finding."""
        self.run(key, result)
        return self.run(key, result)

    def runs(self, key: str, result: CheckResult, times: int) -> list[Verdict]:
        return [self.run(key, result) for _ in range(times)]

    def clear(self) -> frozenset[str]:
        self.state, keys = v.request_clear(self.state, at=self._tick())
        return keys

    def start(self, key: str) -> Verdict:
        self.state = v.start_testing(self.state, key, at=self._tick())
        return self.state.verdict

    def end(self, key: str) -> Verdict:
        self.state = v.end_testing(self.state, key, at=self._tick())
        return self.state.verdict

    def holdings(self) -> set[tuple[str, str, str]]:
        return {h.key for h in self.state.held}
