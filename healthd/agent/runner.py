"""The one runner every trigger goes through: periodic, on-demand, clear and event runs.

Three rules hold whatever asked for a run:

- a check never overlaps itself: one run per check key at a time; a caller that finds
  its key running joins that run and gets its result. A request (on-demand or clear)
  joins only a run that started after it was made: the admin who asks after a repair
  must get a measurement of the repaired GPU, so it waits for an older run to end and
  then runs its own. An exclusive run (a deep diagnostic) is joined by every caller:
  it holds the GPUs alone for minutes, and a second one would hold them twice as long;
- exclusive checks run alone: an exclusive run waits for every shared run to end and
  blocks new ones until it is done (`ExclusiveGate`, a readers/writer lock that lets
  a waiting exclusive run in first, so a busy schedule cannot starve it);
- every run has a deadline (`checks.base.run_check`): a timeout or an exception is
  UNKNOWN, and cancellation reaches the check, which kills its subprocesses.

`run_round` runs several checks as one round: it starts a new NVML round first, so
every NVML check of the round judges the same snapshot (one NVML pass per round).
Periodic rounds that overlap share a pass; a request's round always reads NVML anew.
After every run the runner hands the result to `on_result` (the agent folds it into
the verdict, the metrics and the published state).

Each run gets a context of its own (`checks.base.CheckContext`, frozen), built when it
starts from what the watches have learnt so far (`RoundInputs`): a peer that joins
mid-run reaches the next run, never one in progress.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from checks.base import Attachment, Check, CheckContext, CheckResult, Peer, run_check
from checks.catalog import Catalog
from checks.probes import GpuSource
from healthd.agent.verdict import Trigger
from healthd.check.plans import Planned
from healthd.util.logs import log_context

log = logging.getLogger(__name__)

OnResult = Callable[[str, CheckResult, Trigger], Awaitable[None]]

# Requests are answered by measurements started after they were made (module docstring).
FRESH_TRIGGERS = frozenset({Trigger.ON_DEMAND, Trigger.CLEAR})


@dataclass
class RoundInputs:
    """What the next run's context is built from: the node's identity, the GPU source
    once open, and what the watches keep up to date (the peers the ping check probes,
    this pod's secondary interfaces, the GPU count the Node shows)."""

    catalog: Catalog
    node_name: str
    namespace: str
    expected_gpus: int | None = None
    gpus: GpuSource | None = None
    peers: Sequence[Peer] = ()
    attachments: Sequence[Attachment] = ()

    def context(self) -> CheckContext:
        """A frozen context with what is known now."""
        return CheckContext(catalog=self.catalog, node_name=self.node_name, gpus=self.gpus,
                            expected_gpus=self.expected_gpus, peers=tuple(self.peers),
                            attachments=tuple(self.attachments), namespace=self.namespace)


class ExclusiveGate:
    """Shared runs together, exclusive runs alone; a waiting exclusive run goes next."""

    def __init__(self) -> None:
        self._cond = anyio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive runs queued: new shared runs wait behind them

    @property
    def busy(self) -> bool:
        """Whether any run holds the gate."""
        return self._exclusive or self._shared > 0

    @property
    def exclusive_wanted(self) -> bool:
        """Whether an exclusive run holds the gate or waits for it."""
        return self._exclusive or self._waiting > 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            while self._exclusive or self._waiting:
                await self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            await self._release(shared=True)

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    await self._cond.wait()
            finally:
                self._waiting -= 1
                self._cond.notify_all()  # a cancelled waiter must not block shared runs
            self._exclusive = True
        try:
            yield
        finally:
            await self._release(shared=False)

    async def _release(self, *, shared: bool) -> None:
        with anyio.CancelScope(shield=True):  # release even when the run was cancelled
            async with self._cond:
                if shared:
                    self._shared -= 1
                else:
                    self._exclusive = False
                self._cond.notify_all()


class _Run:
    """A run in progress, which later callers of the same key join."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: CheckResult | None = None


class Runner:
    """Runs checks for every trigger under the three rules in the module docstring."""

    def __init__(self, context: Callable[[], CheckContext], *, on_result: OnResult) -> None:
        self.context = context  # each run's context, built when it starts
        self.on_result = on_result
        self.gate = ExclusiveGate()
        self._running: dict[str, _Run] = {}
        self._rounds = 0  # rounds in flight: a new periodic one reuses their NVML pass

    def running(self) -> frozenset[str]:
        """Keys of the runs in progress."""
        return frozenset(self._running)

    async def run(self, key: str, check: Check, trigger: Trigger, timeout_s: float, *,
                  gated: bool = True) -> CheckResult:
        """Run `check` as `key` (or join the run of `key` in progress) and return the
        result; `on_result` has seen it before this returns. `gated=False` skips the
        exclusive gate: only for checks that merely listen (the xid check on an
        event), which must not wait an hour behind a deep diagnostic."""
        fresh = trigger in FRESH_TRIGGERS and not check.exclusive
        while (current := self._running.get(key)) is not None:
            log.debug("%s the run of %s in progress", "waiting for" if fresh else "joining",
                      key)
            await current.done.wait()
            if not fresh:
                return current.result or CheckResult.unknown(check.NAME,
                                                             "the run was cancelled")
            fresh = False  # a run found from here on started after the request
        current = self._running[key] = _Run()
        try:
            with log_context(check=key):
                current.result = await (self._run_gated(check, timeout_s) if gated
                                        else run_check(check, self.context(), timeout_s))
                await self._deliver(key, current.result, trigger)
            return current.result
        finally:
            del self._running[key]
            current.done.set()

    async def run_round(self, planned: Sequence[Planned],
                        trigger: Trigger) -> dict[str, CheckResult]:
        """Run shared checks together on one NVML pass, then exclusive ones one by one.
        Returns the results by key."""
        results: dict[str, CheckResult] = {}

        async def one(item: Planned) -> None:
            results[item.key] = await self.run(item.key, item.check, trigger, item.timeout_s)

        shared = [p for p in planned if not p.exclusive]
        if shared:
            self._new_round(fresh=trigger in FRESH_TRIGGERS)
            self._rounds += 1
            try:
                async with anyio.create_task_group() as group:
                    for item in shared:
                        group.start_soon(one, item)
            finally:
                self._rounds -= 1
        for item in planned:
            if item.exclusive:
                await one(item)
        return {p.key: results[p.key] for p in planned}

    async def _run_gated(self, check: Check, timeout_s: float) -> CheckResult:
        gate = self.gate.exclusive() if check.exclusive else self.gate.shared()
        async with gate:
            return await run_check(check, self.context(), timeout_s)

    async def _deliver(self, key: str, result: CheckResult, trigger: Trigger) -> None:
        try:
            await self.on_result(key, result, trigger)
        except Exception:  # the consumer's bug must not stop the checks
            log.exception("handling the result of %s failed", key)

    def _new_round(self, *, fresh: bool) -> None:
        """Start a new NVML pass, unless another round is reading the current one and
        this round may share it (`fresh`: it may not)."""
        new_round = getattr(self.context().gpus, "new_round", None)
        if (fresh or self._rounds == 0) and callable(new_round):
            new_round()
