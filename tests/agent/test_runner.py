"""The runner: a check never overlaps itself (a second caller joins the running one),
a request (on-demand, clear) is answered by a measurement started after it, exclusive
checks run alone, every run has its deadline, every result reaches the consumer once,
one round reads NVML once, and each run sees the inputs known when it started."""

from __future__ import annotations

from typing import ClassVar

import anyio
import pytest

from checks.base import BaseCheck, CheckContext, CheckResult, Peer, Severity
from checks.catalog import Catalog
from checks.remapped import RemappedCheck
from checks.snapshot import NvmlGpuSource
from healthd.agent.runner import RoundInputs, Runner
from healthd.agent.verdict import Trigger
from healthd.check.plans import Planned
from tests.sim.conftest import Machine

pytestmark = pytest.mark.anyio


class Probe(BaseCheck):
    """A check that records how many runs of each kind overlap it."""

    NAME: ClassVar[str] = "probe"
    log: ClassVar[list[tuple[str, str]]] = []
    active: ClassVar[set[str]] = set()

    def __init__(self, name: str = "probe", *, delay: float = 0.05, exclusive: bool = False,
                 fail: bool = False) -> None:
        super().__init__()
        self.name, self.delay, self._exclusive, self.fail = name, delay, exclusive, fail
        self.runs = 0

    @property
    def exclusive(self) -> bool:
        return self._exclusive

    async def run(self, ctx: CheckContext) -> CheckResult:
        self.runs += 1
        Probe.log.append((self.name, ",".join(sorted(Probe.active))))
        Probe.active.add(self.name)
        try:
            await anyio.sleep(self.delay)
            if self.fail:
                raise RuntimeError("sensor on fire")
        finally:
            Probe.active.discard(self.name)
        return CheckResult(self.name, Severity.PASS)


@pytest.fixture(autouse=True)
def _fresh_probe_log() -> None:
    Probe.log.clear()
    Probe.active.clear()


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Severity, Trigger]] = []

    async def __call__(self, key: str, result: CheckResult, trigger: Trigger) -> None:
        self.seen.append((key, result.status, trigger))


def runner_with(recorder: Recorder, gpus: object = None) -> Runner:
    inputs = RoundInputs(Catalog(), "n1", "ns", gpus=gpus)  # type: ignore[arg-type]
    return Runner(inputs.context, on_result=recorder)


async def test_a_second_caller_joins_the_run_in_progress() -> None:
    recorder = Recorder()
    runner = runner_with(recorder)
    check = Probe(delay=0.1)
    results: list[CheckResult] = []

    async def call(trigger: Trigger) -> None:
        results.append(await runner.run("probe", check, trigger, 5))

    async with anyio.create_task_group() as group:
        group.start_soon(call, Trigger.PERIODIC)
        await anyio.sleep(0.02)
        group.start_soon(call, Trigger.EVENT)
    assert check.runs == 1
    assert [r.status for r in results] == [Severity.PASS, Severity.PASS]
    assert recorder.seen == [("probe", Severity.PASS, Trigger.PERIODIC)]


@pytest.mark.parametrize("trigger", [Trigger.ON_DEMAND, Trigger.CLEAR])
async def test_a_request_waits_for_an_older_run_and_measures_anew(trigger: Trigger) -> None:
    recorder = Recorder()
    runner = runner_with(recorder)
    check = Probe(delay=0.1)
    async with anyio.create_task_group() as group:
        group.start_soon(runner.run, "probe", check, Trigger.PERIODIC, 5)
        await anyio.sleep(0.02)
        group.start_soon(runner.run, "probe", check, trigger, 5)
        await anyio.sleep(0.02)
        group.start_soon(runner.run, "probe", check, Trigger.PERIODIC, 5)  # joins either
    assert check.runs == 2
    assert [overlapped for _, overlapped in Probe.log] == ["", ""]  # never overlapping
    assert recorder.seen == [("probe", Severity.PASS, Trigger.PERIODIC),
                             ("probe", Severity.PASS, trigger)]


async def test_a_request_joins_a_deep_diagnostic_in_progress() -> None:
    runner = runner_with(Recorder())
    deep = Probe("deep", delay=0.1, exclusive=True)
    async with anyio.create_task_group() as group:
        group.start_soon(runner.run, "deep", deep, Trigger.PERIODIC, 5)
        await anyio.sleep(0.02)
        group.start_soon(runner.run, "deep", deep, Trigger.ON_DEMAND, 5)
    assert deep.runs == 1


async def test_exclusive_checks_run_alone() -> None:
    runner = runner_with(Recorder())
    shared = [Probe(f"s{i}", delay=0.05) for i in range(3)]
    deep = Probe("deep", delay=0.05, exclusive=True)
    async with anyio.create_task_group() as group:
        for check in shared[:2]:
            group.start_soon(runner.run, check.name, check, Trigger.PERIODIC, 5)
        await anyio.sleep(0.01)
        group.start_soon(runner.run, "deep", deep, Trigger.ON_DEMAND, 5)
        await anyio.sleep(0.01)
        # Arrives while the exclusive run waits: must not slip in before it.
        group.start_soon(runner.run, "s2", shared[2], Trigger.PERIODIC, 5)
    overlaps = dict(Probe.log)
    assert overlaps["deep"] == ""  # nothing was running when it started
    assert "deep" not in overlaps["s2"]
    assert [name for name, _ in Probe.log].index("s2") > [n for n, _ in Probe.log].index("deep")


async def test_timeout_and_exception_are_unknown_and_still_reported() -> None:
    recorder = Recorder()
    runner = runner_with(recorder)
    slow = await runner.run("slow", Probe(delay=5), Trigger.PERIODIC, 0.05)
    broken = await runner.run("broken", Probe(delay=0, fail=True), Trigger.CLEAR, 5)
    assert slow.status is Severity.UNKNOWN and "timed out" in slow.reason
    assert broken.status is Severity.UNKNOWN and "sensor on fire" in broken.reason
    assert [s[:2] for s in recorder.seen] == [("slow", Severity.UNKNOWN),
                                               ("broken", Severity.UNKNOWN)]


async def test_a_failing_consumer_does_not_stop_the_runner() -> None:
    async def explode(key: str, result: CheckResult, trigger: Trigger) -> None:
        raise ValueError("consumer bug")

    runner = Runner(lambda: CheckContext(catalog=Catalog()), on_result=explode)
    result = await runner.run("probe", Probe(delay=0), Trigger.PERIODIC, 5)
    assert result.status is Severity.PASS
    assert runner.running() == frozenset()


class CountingSource:
    def __init__(self) -> None:
        self.rounds = 0

    def new_round(self) -> None:
        self.rounds += 1


async def test_a_round_starts_one_nvml_pass_and_returns_results_by_key() -> None:
    gpus = CountingSource()
    runner = runner_with(Recorder(), gpus)
    planned = [Planned(f"c{i}", Probe(f"c{i}", delay=0.01), 5) for i in range(4)]
    planned.append(Planned("deep", Probe("deep", delay=0.01, exclusive=True), 5))
    results = await runner.run_round(planned, Trigger.PERIODIC)
    assert gpus.rounds == 1
    assert list(results) == ["c0", "c1", "c2", "c3", "deep"]
    assert dict(Probe.log)["deep"] == ""


async def test_overlapping_periodic_rounds_share_a_pass_and_a_request_reads_anew() -> None:
    gpus = CountingSource()
    runner = runner_with(Recorder(), gpus)
    async with anyio.create_task_group() as group:
        group.start_soon(runner.run_round, [Planned("slow", Probe("slow", delay=0.1), 5)],
                         Trigger.PERIODIC)
        await anyio.sleep(0.02)
        await runner.run_round([Planned("a", Probe("a", delay=0), 5)], Trigger.PERIODIC)
        assert gpus.rounds == 1  # the open round's pass serves the second one
        await runner.run_round([Planned("b", Probe("b", delay=0), 5)], Trigger.CLEAR)
        assert gpus.rounds == 2


async def test_a_clear_after_a_repair_sees_the_repair_while_an_old_round_is_open(
        machine: Machine) -> None:
    fake = machine(gpus={"count": 2}, faults=[{"gpu": 1, "remapped_rows": {"failure": True}}])
    gpus = NvmlGpuSource()
    recorder = Recorder()
    runner = runner_with(recorder, gpus)
    remapped = RemappedCheck()
    release = anyio.Event()
    try:
        async with anyio.create_task_group() as group:
            # A periodic round whose other check is still measuring (a long pciebw).
            group.start_soon(runner.run_round, [Planned("remapped", remapped, 5),
                                                Planned("slow", Waits(release), 5)],
                             Trigger.PERIODIC)
            with anyio.fail_after(5):
                while not recorder.seen:
                    await anyio.sleep(0.01)
            assert recorder.seen[0][:2] == ("remapped", Severity.EVICT)  # it saw the fault
            fake.clear_faults()  # the GPU is repaired (reset), then the admin clears
            cleared = await runner.run_round([Planned("remapped", remapped, 5)],
                                             Trigger.CLEAR)
            release.set()
        assert cleared["remapped"].status is Severity.PASS
    finally:
        await gpus.aclose()


class Waits(BaseCheck):
    """A check that measures until released."""

    NAME: ClassVar[str] = "waits"

    def __init__(self, release: anyio.Event) -> None:
        super().__init__()
        self.release = release

    async def run(self, ctx: CheckContext) -> CheckResult:
        await self.release.wait()
        return CheckResult(self.NAME, Severity.PASS)


async def test_cancelling_a_run_releases_the_key_and_the_gate() -> None:
    runner = runner_with(Recorder())
    deep = Probe("deep", delay=10, exclusive=True)
    with anyio.move_on_after(0.05):
        await runner.run("deep", deep, Trigger.ON_DEMAND, 60)
    assert runner.running() == frozenset() and not runner.gate.busy
    with anyio.fail_after(2):
        result = await runner.run("probe", Probe(delay=0), Trigger.PERIODIC, 5)
    assert result.status is Severity.PASS


class SeesPeers(BaseCheck):
    """Records the peers its context held at the start and at the end of its run."""

    NAME: ClassVar[str] = "sees"

    def __init__(self, release: anyio.Event) -> None:
        super().__init__()
        self.release = release
        self.seen: list[tuple[str, ...]] = []

    async def run(self, ctx: CheckContext) -> CheckResult:
        self.seen.append(tuple(p.name for p in ctx.peers))
        await self.release.wait()
        self.seen.append(tuple(p.name for p in ctx.peers))
        return CheckResult(self.NAME, Severity.PASS)


async def test_a_run_keeps_the_inputs_it_started_with_and_the_next_sees_new_ones() -> None:
    inputs = RoundInputs(Catalog(), "n1", "ns", peers=[Peer("n2", ["10.0.0.2"])])
    runner = Runner(inputs.context, on_result=Recorder())
    release = anyio.Event()
    check = SeesPeers(release)
    async with anyio.create_task_group() as group:
        group.start_soon(runner.run, "sees", check, Trigger.PERIODIC, 5)
        await anyio.wait_all_tasks_blocked()
        inputs.peers = [Peer("n3", ["10.0.0.3"])]  # the peer watch learnt of a change
        release.set()
    await runner.run("sees", check, Trigger.PERIODIC, 5)
    assert check.seen == [("n2",), ("n2",), ("n3",), ("n3",)]
