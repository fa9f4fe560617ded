"""Properties of the verdict machine over random histories: runs of a few checks with
random findings (WARN, ERR, sticky and non-sticky EVICT, PASS-severity XIDs), blind
GPUs, UNKNOWN and SKIPPED results, every trigger, clear requests and diagnostics
starting and ending. After every step:

- the verdict is the precedence of what is held and what is testing;
- a fatal finding (EVICT or sticky) or an event (XID) of a judged run is held at
  once; any other raising finding is held exactly when it is already held or its
  check's runs that saw its GPU reported it twice running or in 2 of the last 3;
  PASS findings never are;
- an UNKNOWN/SKIPPED result changes neither the verdict nor the holdings;
- a holding leaves only on a clean run of its own check: an EVICT or sticky one only
  after a clear since it was last reported, any other only after `recover_after`
  consecutive clean runs since then (or a clear), so the verdict never drops faster;
- `since` moves exactly when the verdict changes; replaying gives the same states.

And over one noisy signal (one finding on or off in each run): the label changes no
more often than the signal does, a persistent fault is raised within two runs
whatever came before, and a persistent recovery is released within
`Policy.release_bound` runs (`recover_after` x 2^`max_doublings`, or `min_hold` if
longer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from checks.base import CheckResult, Finding, Severity
from healthd.agent import verdict as v
from healthd.kube.conventions import Verdict

from .results import GPUS, clean, run_of, skipped, unknown

KEYS = ("remapped", "power", "xid", "dcgm:3")
CODES = ("HW_SLOWDOWN", "REMAP_PENDING", "REMAP_FAILURE", "XID_79", "XID_95", "XID_13")


@dataclass(frozen=True)
class Run:
    key: str
    result: CheckResult
    trigger: v.Trigger


@dataclass(frozen=True)
class Clear:
    pass


@dataclass(frozen=True)
class Diagnostic:
    key: str
    start: bool


gpu = st.integers(0, GPUS - 1)


@st.composite
def results(draw: st.DrawFn, key: str) -> CheckResult:
    kind = draw(st.sampled_from(["judged", "judged", "judged", "unknown", "skipped"]))
    if kind == "unknown":
        return unknown(key)
    if kind == "skipped":
        return skipped(key)
    found = draw(st.lists(st.tuples(st.sampled_from(CODES), gpu), max_size=3))
    blind = draw(st.lists(gpu, max_size=1))
    return run_of(key, *found, blind=blind)


@st.composite
def runs(draw: st.DrawFn) -> Run:
    key = draw(st.sampled_from(KEYS))
    return Run(key, draw(results(key)), draw(st.sampled_from(list(v.Trigger))))


steps = st.lists(
    st.one_of(
        runs(),
        runs(),
        runs(),
        st.just(Clear()),
        st.builds(Diagnostic, st.sampled_from(["dcgm:3", "dcgm:4"]), st.booleans()),
    ),
    max_size=40,
)


@dataclass
class Since:
    """The test's own record of one holding key since it was last reported."""

    clean_runs: int = 0
    cleared: bool = False


@dataclass
class History:
    """Evidence gathered from the inputs alone, to judge every release against."""

    policy: v.Policy
    seen: dict[tuple[str, str, str], Since] = field(default_factory=dict)
    sightings: dict[tuple[str, str, str], list[bool]] = field(default_factory=dict)

    def observe(self, step: object, before: v.HealthState) -> None:
        if isinstance(step, Clear):
            for h in before.held:
                self.seen[h.key].cleared = True
        elif isinstance(step, Run) and judged(step):
            self._observe_run(step)

    def _observe_run(self, step: Run) -> None:
        reported = {
            (step.key, f.code, f.entity.label)
            for f in step.result.findings
            if f.severity.rank >= Severity.WARN.rank
        }
        blind = {e.entity.label for e in step.result.entities if not e.status.ordered}
        for key in {*reported, *self.sightings}:
            if key[0] == step.key and (key in reported or key[2] not in blind):
                self.sightings.setdefault(key, []).append(key in reported)
        for key in reported:
            self.seen[key] = Since()
        for key, since in self.seen.items():
            if key[0] == step.key and key not in reported and key[2] not in blind:
                since.clean_runs += 1

    def may_release(self, h: v.Held) -> bool:
        since = self.seen[h.key]
        if since.cleared:
            return since.clean_runs >= 1
        return not h.needs_clear and since.clean_runs >= self.policy.recover_after


def step(state: v.HealthState, item: object, at: float, policy: v.Policy) -> v.HealthState:
    if isinstance(item, Run):
        return v.apply(state, item.key, item.result, trigger=item.trigger, at=at, policy=policy)
    if isinstance(item, Clear):
        return v.request_clear(state, at=at)[0]
    assert isinstance(item, Diagnostic)
    move = v.start_testing if item.start else v.end_testing
    return move(state, item.key, at=at)


def replay(items: list[object], policy: v.Policy) -> list[v.HealthState]:
    states = [v.initial(0.0)]
    for at, item in enumerate(items, start=1):
        states.append(step(states[-1], item, float(at), policy))
    return states


def expected_verdict(state: v.HealthState) -> Verdict:
    severities = {h.severity.value for h in state.held}
    for name in ("EVICT", "ERR"):
        if name in severities:
            return Verdict(name)
    if state.testing:
        return Verdict.TESTING
    return Verdict.WARN if "WARN" in severities else Verdict.PASS


def check_raising(item: object, before: v.HealthState, after: v.HealthState,
                  history: History) -> None:
    assert all(h.severity.rank >= Severity.WARN.rank for h in after.held)
    if judged(item):
        was_held = {h.key for h in before.held}
        held = {h.key for h in after.held}
        for f in item.result.findings:
            key = (item.key, f.code, f.entity.label)
            if f.severity.rank >= Severity.WARN.rank:
                assert (key in held) is (key in was_held or evidence(f, history.sightings[key]))


DEFINITIVE_STATES = {"REMAP_PENDING"}  # hardware flags, raised on the first reading


def evidence(f: Finding, sightings: list[bool]) -> bool:
    """Enough to raise a finding just reported (the last of `sightings`)."""
    at_once = f.sticky or f.severity is Severity.EVICT or f.code.startswith(("XID_", "DCGM_")) \
        or f.code in DEFINITIVE_STATES
    return at_once or sightings[-2:] == [True, True] or sum(sightings[-3:]) >= 2


def judged(item: object) -> bool:
    return isinstance(item, Run) and item.result.status.ordered


def check_step(
    item: object, before: v.HealthState, after: v.HealthState, at: float, history: History
) -> None:
    assert after.verdict is expected_verdict(after)
    assert after.since == (before.since if after.verdict is before.verdict else at)
    if after.verdict.precedence < before.verdict.precedence:
        # Only a judged run or the end of a diagnostic lets a verdict down.
        assert judged(item) or (isinstance(item, Diagnostic) and not item.start)
    check_raising(item, before, after, history)
    if isinstance(item, Run) and not item.result.status.ordered:
        assert (after.verdict, after.held, after.judged) == (
            before.verdict,
            before.held,
            before.judged,
        )
    released = [h for h in before.held if h.key not in {n.key for n in after.held}]
    for h in released:
        assert isinstance(item, Run) and item.key == h.check
        assert history.may_release(h), f"{h} released too early"


@settings(max_examples=200, deadline=None)
@given(items=steps, recover_after=st.integers(1, 3))
def test_every_step_keeps_the_invariants(items: list[object], recover_after: int) -> None:
    policy = v.Policy(recover_after=recover_after)
    history = History(policy)
    states = replay(items, policy)
    for at, (item, before, after) in enumerate(zip(items, states[:-1], states[1:], strict=True), 1):
        history.observe(item, before)
        check_step(item, before, after, float(at), history)


@settings(max_examples=100, deadline=None)
@given(items=steps)
def test_the_state_is_a_function_of_the_inputs(items: list[object]) -> None:
    policy = v.Policy()
    assert replay(items, policy) == replay(items, policy)


@settings(max_examples=100, deadline=None)
@given(items=steps)
def test_a_clear_on_a_node_holding_nothing_is_a_no_op(items: list[object]) -> None:
    state = replay(items, v.Policy())[-1]
    cleared, keys = v.request_clear(state, at=1e6)
    assert keys == state.holding_checks()
    if not state.held:
        assert cleared is state
    else:
        assert cleared.verdict is state.verdict
        assert all(h.clear_requested for h in cleared.held)


@settings(max_examples=100, deadline=None)
@given(items=steps)
def test_unknown_results_never_change_the_verdict(items: list[object]) -> None:
    policy = v.Policy()
    state = replay(items, policy)[-1]
    for key in KEYS:
        for result in (unknown(key), skipped(key)):
            after = v.apply(state, key, result, trigger=v.Trigger.PERIODIC, at=1e6, policy=policy)
            assert (after.verdict, after.since) == (state.verdict, state.since)
            assert after.held == state.held


# -- one noisy signal ------------------------------------------------------------------

SIGNAL = "power"
FAULT = run_of(SIGNAL, ("HW_SLOWDOWN", 0))
OK = clean(SIGNAL)
signals = st.lists(st.booleans(), max_size=120)
policies = st.builds(v.Policy, recover_after=st.integers(1, 3),
                     max_doublings=st.integers(0, 4), flap_window=st.integers(1, 60),
                     min_hold=st.integers(0, 10))


def verdicts(signal: list[bool], policy: v.Policy, state: v.HealthState | None = None
             ) -> list[Verdict]:
    state = state or v.initial(0.0)
    out = [state.verdict]
    for at, faulty in enumerate(signal, start=1):
        state = v.apply(state, SIGNAL, FAULT if faulty else OK, trigger=v.Trigger.PERIODIC,
                        at=float(at), policy=policy)
        out.append(state.verdict)
    return out


def changes(sequence: list[bool] | list[Verdict]) -> int:
    return sum(a != b for a, b in pairwise(sequence))


@settings(max_examples=300, deadline=None)
@given(signal=signals, policy=policies)
def test_the_label_changes_no_more_often_than_the_signal(signal: list[bool],
                                                         policy: v.Policy) -> None:
    assert changes(verdicts(signal, policy)) <= changes([False, *signal])


def settled(signal: list[bool], policy: v.Policy) -> v.HealthState:
    state = v.initial(0.0)
    for at, faulty in enumerate(signal, start=1):
        state = v.apply(state, SIGNAL, FAULT if faulty else OK, trigger=v.Trigger.PERIODIC,
                        at=float(at), policy=policy)
    return state


@settings(max_examples=300, deadline=None)
@given(signal=signals, policy=policies)
def test_a_persistent_fault_is_raised_within_two_runs(signal: list[bool],
                                                      policy: v.Policy) -> None:
    after = verdicts([True] * 2, policy, settled(signal, policy))
    assert after[-1] is Verdict.WARN


@settings(max_examples=300, deadline=None)
@given(signal=signals, policy=policies)
def test_a_persistent_recovery_is_released_within_the_capped_hold(
        signal: list[bool], policy: v.Policy) -> None:
    bound = max(policy.recover_after * 2 ** policy.max_doublings, policy.min_hold)
    assert policy.release_bound == bound
    after = verdicts([False] * bound, policy, settled(signal, policy))
    assert after[-1] is Verdict.PASS
