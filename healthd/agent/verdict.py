"""The verdict state machine: from check results to the node's one verdict.

Pure on purpose (no I/O, no clock, no logging; every time is passed in), so each
rule is a table test and the whole machine can be replayed. Every entry point takes
a `HealthState` and returns a new one:

- `apply(state, key, result, ...)`: one finished run of a check (any trigger);
- `start_testing` / `end_testing`: an exclusive diagnostic holds the GPUs;
- `request_clear`: an admin asked to clear what holds the node bad.

Rules:
- A finding of severity WARN, ERR or EVICT is *held* at once, per (check key, code,
  entity): the same code on gpu1 and gpu3 are two holdings. PASS-severity findings
  (application XIDs) are recorded, never held.
- A holding of check K is released after `Policy.recover_after` consecutive runs of K
  that completed (status neither UNKNOWN nor SKIPPED) without it. A run that reports
  it again resets the count. A run that could not tell (UNKNOWN/SKIPPED, for the
  whole check or for the holding's entity) neither counts nor resets. Runs of other
  checks never touch it.
- Sticky codes and every EVICT holding are released only by a clear request followed
  by one such clean run of K; no number of runs alone releases them, so a periodic
  run never downgrades EVICT. A clear marks every holding; a marked holding goes on
  its next clean run. A run that reports the code again spends the clear.
- Verdict, by precedence: EVICT if any EVICT is held, ERR if any ERR is held, TESTING
  while an exclusive check runs, WARN if any WARN is held, else PASS. `since` moves
  only when the verdict changes. Before any judgement (`judged` False) the verdict is
  PASS but publishers leave the label alone: UNKNOWN never changes the label.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from checks.base import CheckResult, Finding, Severity
from healthd.kube.conventions import Verdict

# Severities that raise the verdict: WARN and above.
_HOLD_RANK = Severity.WARN.rank


class Trigger(enum.StrEnum):
    """What started a run: all go through the same runner and the same rules."""

    PERIODIC = "periodic"
    ON_DEMAND = "on-demand"
    CLEAR = "clear"
    EVENT = "event"


@dataclass(frozen=True)
class Held:
    """One finding holding the verdict above PASS, until its check recovers."""

    code: str
    check: str  # the check KEY that reported it ("remapped", "dcgm:3")
    entity: str  # Entity.label: "gpu3", "node", "peer/n2"
    severity: Severity
    sticky: bool
    message: str
    since: float  # when it was first held
    passes: int = 0  # consecutive clean runs of `check` since it was last reported
    clear_requested: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a holding: (check key, code, entity)."""
        return (self.check, self.code, self.entity)

    @property
    def needs_clear(self) -> bool:
        """Sticky codes and EVICT holdings leave only through a clear request."""
        return self.sticky or self.severity is Severity.EVICT


@dataclass(frozen=True)
class CheckState:
    """The last run of one check key, whatever it concluded."""

    status: Severity
    at: float
    trigger: Trigger
    reason: str = ""
    duration_s: float = 0.0
    # Secondary networks the run looked at (ping's per-network view; empty for the
    # checks that know no networks), so "nothing failed on net1" is told apart from
    # "net1 was not probed".
    networks: tuple[str, ...] = ()


def _frozen_map(items: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(items or {}))


@dataclass(frozen=True)
class HealthState:
    """Everything the node's published state is made from."""

    verdict: Verdict
    since: float = 0.0  # when the verdict last changed
    judged: bool = False  # at least one check has ever given a judgement
    held: tuple[Held, ...] = ()  # worst first
    checks: Mapping[str, CheckState] = field(default_factory=_frozen_map)
    findings: tuple[Finding, ...] = ()  # every check's latest findings, by check key
    testing: frozenset[str] = frozenset()  # exclusive checks in progress
    check_findings: Mapping[str, tuple[Finding, ...]] = field(default_factory=_frozen_map)

    @property
    def top(self) -> Held | None:
        """The holding that decides the verdict (None when nothing is held)."""
        return self.held[0] if self.held else None

    def holding_checks(self) -> frozenset[str]:
        """Keys of the checks that hold anything."""
        return frozenset(h.check for h in self.held)


@dataclass(frozen=True)
class Policy:
    """How fast a node recovers: `recover_after` consecutive clean runs (>= 1)."""

    recover_after: int = 2

    def __post_init__(self) -> None:
        if self.recover_after < 1:
            raise ValueError(f"recover_after must be at least 1, got {self.recover_after}")


def initial(at: float = 0.0) -> HealthState:
    """The state of an agent that has judged nothing yet."""
    return HealthState(verdict=Verdict.PASS, since=at)


def verdict_of(held: Iterable[Held], testing: frozenset[str]) -> Verdict:
    """The verdict that holdings and running diagnostics add up to."""
    severities = {h.severity for h in held}
    if Severity.EVICT in severities:
        return Verdict.EVICT
    if Severity.ERR in severities:
        return Verdict.ERR
    if testing:
        return Verdict.TESTING
    if Severity.WARN in severities:
        return Verdict.WARN
    return Verdict.PASS


def apply(
    state: HealthState,
    key: str,
    result: CheckResult,
    *,
    trigger: Trigger,
    at: float,
    policy: Policy,
) -> HealthState:
    """Fold one finished run of check `key` into the state."""
    checks = {**state.checks, key: _check_state(result, trigger, at)}
    per_check = {**state.check_findings, key: tuple(result.findings)}
    if not result.status.ordered:
        # Could not tell (or does not apply): recorded, but no judgement either way.
        return _settle(state, at, checks=checks, check_findings=per_check)
    held = _judge(state.held, key, result, at, policy)
    return _settle(state, at, held=held, judged=True, checks=checks, check_findings=per_check)


def start_testing(state: HealthState, key: str, *, at: float) -> HealthState:
    """An exclusive check `key` now holds the GPUs."""
    if key in state.testing:
        return state
    return _settle(state, at, testing=state.testing | {key})


def end_testing(state: HealthState, key: str, *, at: float) -> HealthState:
    """The exclusive check `key` let the GPUs go (finished, failed or never started)."""
    if key not in state.testing:
        return state
    return _settle(state, at, testing=state.testing - {key})


def request_clear(state: HealthState, *, at: float) -> tuple[HealthState, frozenset[str]]:
    """Mark every holding for release on its check's next clean run; return the keys
    of the checks to re-run. A node that holds nothing is left as it is."""
    if not state.held:
        return state, frozenset()
    marked = tuple(replace(h, clear_requested=True) for h in state.held)
    return _settle(state, at, held=marked), state.holding_checks()


def _check_state(result: CheckResult, trigger: Trigger, at: float) -> CheckState:
    networks = tuple(sorted({s.entity.network for s in result.entities if s.entity.network}))
    return CheckState(result.status, at, trigger, result.reason, result.duration_s, networks)


def _judge(
    held: tuple[Held, ...], key: str, result: CheckResult, at: float, policy: Policy
) -> list[Held]:
    """The holdings after one completed run of `key`: renew what it reports again,
    count a clean run for the rest of its holdings, hold what is new."""
    reported = _raising(result.findings)
    blind = {e.entity.label for e in result.entities if not e.status.ordered}
    out: list[Held] = []
    for h in held:
        if h.check != key:
            out.append(h)
        elif (found := reported.pop((h.code, h.entity), None)) is not None:
            out.append(_renew(h, found))
        elif h.entity in blind:
            out.append(h)  # the run could not see this entity: no evidence either way
        elif (kept := _clean_run(h, policy)) is not None:
            out.append(kept)
    out.extend(_hold(key, f, at) for f in reported.values())
    return out


def _raising(findings: Iterable[Finding]) -> dict[tuple[str, str], Finding]:
    """The findings that are held, by (code, entity); the worst of duplicates wins."""
    out: dict[tuple[str, str], Finding] = {}
    for f in findings:
        if f.severity.rank < _HOLD_RANK:
            continue
        slot = (f.code, f.entity.label)
        if slot not in out or f.severity.rank > out[slot].severity.rank:
            out[slot] = f
    return out


def _hold(key: str, f: Finding, at: float) -> Held:
    return Held(f.code, key, f.entity.label, f.severity, f.sticky, f.message, since=at)


def _renew(h: Held, f: Finding) -> Held:
    """Reported again: the count starts over and a pending clear is spent."""
    severity = f.severity if f.severity.rank > h.severity.rank else h.severity
    return replace(
        h,
        severity=severity,
        sticky=h.sticky or f.sticky,
        message=f.message,
        passes=0,
        clear_requested=False,
    )


def _clean_run(h: Held, policy: Policy) -> Held | None:
    """One clean run of the holding's check: the holding, counted, or None if released."""
    if h.clear_requested:
        return None
    passes = h.passes + 1
    if not h.needs_clear and passes >= policy.recover_after:
        return None
    return replace(h, passes=passes)


def _worst_first(h: Held) -> tuple[int, float, str, str, str]:
    return (-h.severity.rank, h.since, h.check, h.code, h.entity)


def _settle(state: HealthState, at: float, **changes: Any) -> HealthState:
    """Apply `changes`, then derive what follows from them: order, findings, verdict."""
    new = replace(state, **changes)
    held = tuple(sorted(new.held, key=_worst_first))
    per_check = _frozen_map(new.check_findings)
    findings = tuple(f for k in sorted(per_check) for f in per_check[k])
    checks = _frozen_map(new.checks)
    verdict = verdict_of(held, new.testing)
    since = state.since if verdict is state.verdict else at
    return replace(
        new,
        verdict=verdict,
        since=since,
        held=held,
        checks=checks,
        findings=findings,
        check_findings=per_check,
    )
