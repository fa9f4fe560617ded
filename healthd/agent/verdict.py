"""The verdict state machine: from check results to the node's one verdict.

Pure on purpose (no I/O, no clock, no logging; every time is passed in), so each
rule is a table test and the whole machine can be replayed. Every entry point takes
a `HealthState` and returns a new one:

- `apply(state, key, result, ...)`: one finished run of a check (any trigger);
- `start_testing` / `end_testing`: an exclusive diagnostic holds the GPUs;
- `request_clear`: an admin asked to clear what holds the node bad;
- `resume`: what the Node showed before this process started (healthd.agent.resume),
  the exclusive checks it showed running among it.

Rules:
- Findings are tracked per (check key, code, entity): the same code on gpu1 and gpu3
  are two tracks. PASS-severity findings (application XIDs) are recorded, never held.
- Raising. A fatal finding (EVICT severity or sticky, GPU lost among them) is held
  at once. Any other WARN/ERR finding is held once its check reported it in
  `rule.seen` of the last `rule.runs` completed runs that could see its entity
  (`checks.catalog.RaiseRule`, per code; default 2 of 3), or in two consecutive such
  runs; codes with rule 1 of 1 (XIDs, DCGM tests) are held at once. Until then it is
  *pending*: in the latest findings, not in the verdict.
- Releasing. A holding of check K is released after `Policy.hold_runs(flaps, gap)`
  consecutive runs of K that completed (status neither UNKNOWN nor SKIPPED) without
  it, and no sooner than `min_hold` such runs (clean or not) after it was raised. The
  hold is `recover_after` x 4^flaps (each flap doubles it twice), and at least twice
  the longest clean stretch its signal has shown between two sightings (`gap`):
  never more than `recover_after` x 2^`max_doublings`. A run that reports it again
  resets the count. A run that could not tell (UNKNOWN/SKIPPED, for the whole check
  or for the holding's entity) neither counts nor resets. Runs of other checks never
  touch it.
- Flaps. A finding reported again after one or more completed runs without it has
  flapped (whether or not it was held meanwhile): its track's `flaps` grows by one,
  its `gap` keeps the longest such stretch, and `HealthState.flaps_total` counts it.
  A holding's `flaps` is its track's, up to where the hold stops growing, so an
  oscillating signal is held longer with every swing and settles on the worse state;
  `min_hold` keeps a noisy signal's first pair of sightings from buying a release two
  runs later, before it has had a chance to swing. A track without a sighting for
  `flap_window` completed runs is forgotten; a clear starts its count over.
- Sticky codes and every EVICT holding are released only by a clear request followed
  by one such clean run of K; no number of runs alone releases them, so a periodic
  run never downgrades EVICT. A clear marks every holding; a marked holding goes on
  its next clean run. A run that reports the code again spends the clear.
- A holding keeps the message it was raised with: the published state changes when
  its meaning does, not when a measured value moves.
- Verdict, by precedence: EVICT if any EVICT is held, ERR if any ERR is held, TESTING
  while an exclusive check runs, WARN if any WARN is held, else PASS. `since` moves
  only when the verdict changes. Before any judgement (`judged` False) the verdict is
  PASS but publishers leave the label alone: UNKNOWN never changes the label.
- Resuming. A restarted agent takes back the holdings its Node showed (`resume`):
  each keeps its severity, stickiness, pending clear and flaps, and a track so later
  sightings count as before; its clean-run count starts over. An exclusive check the
  Node showed running stays in `testing` (its Job outlives the process) until its
  result, or the news that it has none, ends it. A holding of check
  `RESUMED` stands for a verdict the Node showed that nothing else explains: a clear
  releases it at once (there is no check to re-run).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from checks.base import CheckResult, Finding, Severity
from checks.catalog import Catalog
from healthd.kube.conventions import Verdict

# Severities that raise the verdict: WARN and above.
_HOLD_RANK = Severity.WARN.rank

# The check key of a holding that stands for a verdict resumed from the Node's label
# alone (healthd.agent.resume): no check runs under it.
RESUMED = "resumed"


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
    flaps: int = 0  # times it came back, up to Policy.max_flaps (each quadruples the hold)
    gap: int = 0  # its signal's longest clean stretch between two sightings
    age: int = 0  # runs of `check` that could see it since it was raised
    # The entity's UUID (GPUs) as reported with it: kept with the holding, so it renders
    # the same whether or not the latest run saw the finding again.
    uuid: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a holding: (check key, code, entity)."""
        return (self.check, self.code, self.entity)

    @property
    def needs_clear(self) -> bool:
        """Sticky codes and EVICT holdings leave only through a clear request."""
        return self.sticky or self.severity is Severity.EVICT


TrackKey = tuple[str, str, str]  # (check key, code, entity), like Held.key


@dataclass(frozen=True)
class Track:
    """The recent history of one (check key, code, entity), held or not: what damping
    decides from."""

    recent: tuple[bool, ...] = ()  # reported in the latest completed runs, newest last
    flaps: int = 0  # times it came back after a clean run (a clear starts over)
    clean: int = 0  # completed runs without it since it was last reported
    gap: int = 0  # the longest `clean` it came back after (a clear starts over)


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
    # Peers (entity labels) the run examined, those that answered, and those the run
    # before examined too: what ping's published view says it probed and reached
    # (healthd.agent.node_view), with rotating peer sets (healthd.blame.peersets).
    peers: tuple[str, ...] = ()
    answered: tuple[str, ...] = ()
    settled: tuple[str, ...] = ()


def _frozen_map(items: Mapping[Any, Any] | None = None) -> Mapping[Any, Any]:
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
    tracks: Mapping[TrackKey, Track] = field(default_factory=_frozen_map)
    flaps_total: int = 0  # flaps since start (a counter for the metrics)

    @property
    def top(self) -> Held | None:
        """The holding that decides the verdict (None when nothing is held)."""
        return self.held[0] if self.held else None

    def holding_checks(self) -> frozenset[str]:
        """Keys of the checks that hold anything."""
        return frozenset(h.check for h in self.held)


@dataclass(frozen=True)
class Policy:
    """How fast a node raises and recovers: each code's raise rule (the catalog),
    `recover_after` consecutive clean runs (>= 1) doubled twice per flap up to
    `max_doublings` doublings, the fewest runs a holding lasts (`min_hold`), and how
    long a finding's flaps are remembered."""

    recover_after: int = 2
    catalog: Catalog = field(default_factory=Catalog, compare=False)
    max_doublings: int = 5
    flap_window: int = 100  # completed runs without a sighting that forget a track
    min_hold: int = 6  # runs of its check a holding lasts at least once raised

    def __post_init__(self) -> None:
        if self.recover_after < 1:
            raise ValueError(f"recover_after must be at least 1, got {self.recover_after}")
        if self.max_doublings < 0 or self.flap_window < 1 or self.min_hold < 0:
            raise ValueError("max_doublings and min_hold must be >= 0 and flap_window >= 1")

    @property
    def max_hold(self) -> int:
        """The most clean runs any holding waits for: `recover_after` x 2^max_doublings."""
        return self.recover_after << self.max_doublings

    @property
    def max_flaps(self) -> int:
        """Flaps past which the hold stops growing (each one is two doublings)."""
        return (self.max_doublings + 1) // 2

    @property
    def release_bound(self) -> int:
        """Clean runs that release any holding that needs no clear, whatever came before."""
        return max(self.max_hold, self.min_hold)

    def hold_runs(self, flaps: int, gap: int = 0) -> int:
        """Clean runs that release a holding that has flapped `flaps` times and whose
        signal once stayed away `gap` runs before it came back: `recover_after` x
        4^flaps, at least 2 x gap (its silences prove nothing shorter), capped."""
        doubled = self.recover_after << min(2 * flaps, self.max_doublings)
        return min(max(doubled, 2 * gap), self.max_hold)

    def raises(self, f: Finding, recent: tuple[bool, ...]) -> bool:
        """Whether finding `f`, reported in the latest of the `recent` runs, is held."""
        rule = self.catalog.lookup(f.code).raise_rule
        if f.severity is Severity.EVICT or f.sticky or rule.seen <= 1:
            return True
        return sum(recent[-rule.runs:]) >= rule.seen or recent[-2:] == (True, True)

    def memory(self, code: str) -> int:
        """How many recent runs a track keeps."""
        return max(self.catalog.lookup(code).raise_rule.runs, 2)


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
    checks = {**state.checks, key: _check_state(result, trigger, at, state.checks.get(key))}
    per_check = {**state.check_findings, key: tuple(result.findings)}
    if not result.status.ordered:
        # Could not tell (or does not apply): recorded, but no judgement either way.
        return _settle(state, at, checks=checks, check_findings=per_check)
    held, tracks, flaps = _judge(state, key, result, at, policy)
    return _settle(state, at, held=held, judged=True, checks=checks, check_findings=per_check,
                   tracks=tracks, flaps_total=state.flaps_total + flaps)


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
    of the checks to re-run. A node that holds nothing is left as it is; a resumed
    verdict (check `RESUMED`) goes at once."""
    if not state.held:
        return state, frozenset()
    marked = tuple(replace(h, clear_requested=True) for h in state.held if h.check != RESUMED)
    return _settle(state, at, held=marked), frozenset(h.check for h in marked)


def resume(state: HealthState, held: Iterable[Held], checks: Mapping[str, CheckState], *,
           shown: Verdict | None, since: float | None, at: float,
           testing: frozenset[str] = frozenset()) -> HealthState:
    """Take back what the Node showed before this process started: the holdings
    `state` does not hold yet (each with a track, so its flaps carry on), the last
    state of checks that have not run since, and the exclusive checks it showed
    running (`testing`: their runs outlive the process). `shown`: the verdict the
    Node showed (None: none), which counts as a judgement; `since`: when it last
    changed, kept while the verdict is the same."""
    have = {h.key for h in state.held}
    taken = tuple(h for h in held if h.key not in have)
    tracks = dict(state.tracks)
    for h in taken:
        tracks.setdefault(h.key, Track(recent=(True,), flaps=h.flaps, gap=h.gap))
    new = _settle(state, at, held=(*state.held, *taken), checks={**checks, **state.checks},
                  tracks=tracks, judged=state.judged or shown is not None or bool(taken),
                  testing=state.testing | testing)
    if since is not None and new.verdict is shown:
        new = replace(new, since=since)
    return new


def _check_state(result: CheckResult, trigger: Trigger, at: float,
                 before: CheckState | None) -> CheckState:
    networks = tuple(sorted({s.entity.network for s in result.entities if s.entity.network}))
    peers = tuple(sorted({s.entity.label for s in result.entities if s.entity.kind == "peer"}))
    answered = tuple(sorted({s.entity.label for s in result.entities
                             if s.entity.kind == "peer" and s.status is Severity.PASS}))
    settled = tuple(p for p in peers if before is not None and p in before.peers)
    return CheckState(result.status, at, trigger, result.reason, result.duration_s, networks,
                      peers, answered, settled)


def _judge(
    state: HealthState, key: str, result: CheckResult, at: float, policy: Policy
) -> tuple[list[Held], dict[TrackKey, Track], int]:
    """The holdings and tracks after one completed run of `key`, and how many of its
    findings came back (flapped): renew what it reports again, count a clean run for
    the rest of its holdings, hold what now has enough evidence."""
    reported = _raising(result.findings)
    blind = {e.entity.label for e in result.entities if not e.status.ordered}
    tracks, flaps = _tracked(state.tracks, key, reported, blind, policy)
    out: list[Held] = []
    for h in state.held:
        if h.check != key:
            out.append(h)
        elif (found := reported.pop((h.code, h.entity), None)) is not None:
            out.append(_renew(h, found, tracks[h.key], policy))
        elif h.entity in blind:
            out.append(h)  # the run could not see this entity: no evidence either way
        elif (kept := _clean_run(h, policy)) is not None:
            out.append(kept)
        elif h.clear_requested and h.key in tracks:
            tracks[h.key] = replace(tracks[h.key], flaps=0, gap=0)  # cleared: a fresh start
    for (code, entity), f in reported.items():
        slot = (key, code, entity)
        if policy.raises(f, tracks[slot].recent):
            out.append(_hold(key, f, at, tracks[slot], policy))
    return out, tracks, flaps


def _tracked(
    tracks: Mapping[TrackKey, Track],
    key: str,
    reported: Mapping[tuple[str, str], Finding],
    blind: set[str],
    policy: Policy,
) -> tuple[dict[TrackKey, Track], int]:
    """Every track with this run of `key` recorded (reported or not, for each entity
    the run could see), and how many came back after a clean run. A track clean for
    the flap window is forgotten."""
    out: dict[TrackKey, Track] = {}
    returns = 0
    for slot in {*tracks, *((key, code, entity) for code, entity in reported)}:
        track = tracks.get(slot, Track())
        check, code, entity = slot
        seen = (code, entity) in reported
        if check != key or (entity in blind and not seen):
            out[slot] = track
            continue
        recent = (*track.recent, seen)[-policy.memory(code):]
        came_back = seen and slot in tracks and track.clean > 0
        returns += came_back
        gap = max(track.gap, track.clean) if came_back else track.gap
        track = Track(recent, track.flaps + came_back, 0 if seen else track.clean + 1, gap)
        if track.clean < policy.flap_window:
            out[slot] = track
    return out, returns


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


def _hold(key: str, f: Finding, at: float, track: Track, policy: Policy) -> Held:
    return Held(f.code, key, f.entity.label, f.severity, f.sticky, f.message, since=at,
                flaps=min(track.flaps, policy.max_flaps), gap=track.gap, uuid=f.entity.uuid)


def _renew(h: Held, f: Finding, track: Track, policy: Policy) -> Held:
    """Reported again: the count starts over and a pending clear is spent. The
    message changes only with the severity (a moving value is no news); flaps and
    gap follow its track (flaps only up to where the hold stops growing)."""
    worse = f.severity.rank > h.severity.rank
    return replace(
        h,
        severity=f.severity if worse else h.severity,
        sticky=h.sticky or f.sticky,
        message=f.message if worse else h.message,
        passes=0,
        clear_requested=False,
        flaps=min(track.flaps, policy.max_flaps),
        gap=track.gap,
        age=h.age + 1,
        uuid=h.uuid or f.entity.uuid,
    )


def _clean_run(h: Held, policy: Policy) -> Held | None:
    """One clean run of the holding's check: the holding, counted, or None if released."""
    if h.clear_requested:
        return None
    passes, age = h.passes + 1, h.age + 1
    if (not h.needs_clear and passes >= policy.hold_runs(h.flaps, h.gap)
            and age >= policy.min_hold):
        return None
    return replace(h, passes=passes, age=age)


def _worst_first(h: Held) -> tuple[int, float, str, str, str]:
    return (-h.severity.rank, h.since, h.check, h.code, h.entity)


def _settle(state: HealthState, at: float, **changes: Any) -> HealthState:
    """Apply `changes`, then derive what follows from them: order, findings, verdict."""
    new = replace(state, **changes)
    held = tuple(sorted(new.held, key=_worst_first))
    per_check = _frozen_map(new.check_findings)
    findings = tuple(f for k in sorted(per_check) for f in per_check[k])
    checks = _frozen_map(new.checks)
    tracks = _frozen_map(new.tracks)
    verdict = verdict_of(held, new.testing)
    since = state.since if verdict is state.verdict else at
    return replace(
        new,
        verdict=verdict,
        since=since,
        held=held,
        checks=checks,
        tracks=tracks,
        findings=findings,
        check_findings=per_check,
    )
