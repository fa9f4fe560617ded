"""What the Node should show for a health state: labels, annotation, condition, Events.

Pure rendering, kept apart from the writer (`node_status`) so every rule about the
published state is a plain function of a `HealthState`:

- the verdict label, only once something has been judged (UNKNOWN never changes it);
- the `health` annotation: compact JSON, bounded to `HEALTH_LIMIT` bytes by dropping
  the least severe findings first and saying how many went (`"truncated": N`). It
  says what the verdict means, not what the last run measured, so it changes only
  when that meaning does: holdings keep the message they were raised with, a check's
  status is what it holds (or that it could not tell), and pending findings (seen,
  not yet raised) stay out; live values are in the metrics, `healthd check` and
  `last-run`;
- the `GPUUnhealthy` condition without its times (the writer owns
  `lastTransitionTime`, which moves only when the status changes);
- the Event that announces a verdict transition, readable by a person.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import checks
from checks.base import Finding, Severity, worst
from healthd.agent.verdict import CheckState, HealthState, Held
from healthd.kube.conventions import CONDITION_TYPE, Keys, Reason, Verdict
from healthd.published import (
    REPAIR_TESTING,
    CheckStatus,
    Health,
    Holding,
    NetworkView,
    PingView,
    Seen,
    dumps,
    holding_json,
    seen_json,
)
from healthd.util.times import rfc3339

HEALTH_LIMIT = 8 * 1024  # bytes of the health annotation (JSON is ASCII-escaped)
MESSAGE_CHARS = 240  # per finding in the annotation
CONDITION_MESSAGE_CHARS = 1024


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class DesiredNode:
    """What the node should show, our keys only. A key absent from a mapping is left
    alone; a key mapped to None is removed."""

    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    condition: dict[str, Any] | None = None  # GPUUnhealthy without times; None = leave it


def desired_from(
    state: HealthState,
    keys: Keys,
    *,
    node: str,
    dcgm_levels: Mapping[int, str | None],
    last_run: str | None = None,
    repair: str = "",
    repair_note: str = "",
) -> DesiredNode:
    """The published state for `state`. `dcgm_levels` maps a DCGM level to its label
    value (`dcgm_label_value(...)`); `last_run` is the answer to the last on-demand
    request (`requests.answer`), left alone when None; `repair` says what the
    controller's repair does while it holds the node TESTING, `repair_note` what the
    condition says of a repair that keeps it out (`Repair.note`)."""
    labels: dict[str, str | None] = {keys.dcgm_level(n): v for n, v in dcgm_levels.items()}
    if state.judged:
        labels[keys.gpuhealth] = state.verdict.value
    annotations: dict[str, str | None] = {keys.health: health_json(state)}
    if last_run is not None:
        annotations[keys.last_run] = last_run
    return DesiredNode(labels, annotations, condition(state, node=node, repair=repair,
                                                      repair_note=repair_note))


# -- entities and messages -------------------------------------------------------------


def describe_entity(label: str, uuid: str = "") -> str:
    """`GPU 5 (GPU-1234...)`, `GPU 5`, `node`, `peer n2`, `storage class fast`."""
    if label.startswith("gpu") and label[3:].isdigit():
        return f"GPU {label[3:]}" + (f" ({uuid})" if uuid else "")
    kind, _, name = label.partition("/")
    if kind == "storage":
        return f"storage class {name}"
    return f"{kind} {name}" if name else kind


def describe_held(held: Held) -> str:
    """`GPU 5 (GPU-1234...): XID 79: GPU has fallen off the bus`: from the holding
    alone, so it reads the same whatever the latest run saw."""
    return f"{describe_entity(held.entity, held.uuid)}: {held.message}"


def _more(count: int) -> str:
    return f" (+{count} more finding{'s' if count > 1 else ''})" if count > 0 else ""


# -- the GPUUnhealthy condition --------------------------------------------------------


def condition(state: HealthState, *, node: str, repair: str = "",
              repair_note: str = "") -> dict[str, Any]:
    """GPUUnhealthy: True for ERR/EVICT, False for PASS/WARN/TESTING, Unknown before
    any judgement. Reason: the top holding's code, else GPUsHealthy/DiagnosticRunning.
    The message of a held finding ends with `repair_note` (`; repair: reboot needed`):
    the controller's record says it, but only the agent writes the condition."""
    if not state.judged:
        status, reason = "Unknown", Reason.CANNOT_JUDGE.value
        message = f"no health check on {node} has given a judgement yet"
    else:
        status = "True" if state.verdict.unhealthy else "False"
        reason, message = _condition_reason(state, node, repair)
        if repair_note and state.top is not None and state.verdict is not Verdict.TESTING:
            note = f"; repair: {repair_note}"[:CONDITION_MESSAGE_CHARS // 2]
            message = _clip(message, CONDITION_MESSAGE_CHARS - len(note)) + note
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": _clip(message, CONDITION_MESSAGE_CHARS),
    }


def _condition_reason(state: HealthState, node: str, repair: str = "") -> tuple[str, str]:
    top = state.top
    if state.verdict is Verdict.TESTING:
        diagnostics = sorted(state.testing - {REPAIR_TESTING})
        parts = [f"GPU repair: {repair}"] if REPAIR_TESTING in state.testing else []
        if diagnostics or not parts:
            parts.append(f"exclusive diagnostic running: {', '.join(diagnostics) or 'diagnostic'}")
        return Reason.TESTING.value, "; ".join(parts)
    if top is None:
        return Reason.HEALTHY.value, f"all GPU health checks on {node} pass"
    return top.code, describe_held(top) + _more(len(state.held) - 1)


def _testing(state: HealthState) -> str:
    return ", ".join("GPU repair" if key == REPAIR_TESTING else key
                     for key in sorted(state.testing)) or "diagnostic"


# -- the health annotation -------------------------------------------------------------


def health_json(state: HealthState, limit: int = HEALTH_LIMIT) -> str:
    """The `health` annotation: verdict, since, top code, holdings, other findings and
    per-check status, in at most `limit` bytes (least severe findings dropped first)."""
    head = Health(
        verdict=state.verdict.value if state.judged else "UNKNOWN",
        since=rfc3339(state.since),
        top=state.top.code if state.top else None,
        testing=tuple(sorted(state.testing)),
        ping=ping_view(state),
        checks={key: _check_status(cs, _held_status(state, key))
                for key, cs in sorted(state.checks.items())})
    items = _ranked_items(state)
    kept = _fit(head, items, limit)
    doc = replace(head,
                  held=tuple(e for e in kept if isinstance(e, Holding)),
                  findings=tuple(e for e in kept if isinstance(e, Seen)),
                  truncated=len(items) - len(kept) if len(kept) < len(items) else None)
    text = doc.encode()
    if len(text) > limit:  # per-check status alone is too long: keep the verdict readable
        text = replace(doc, checks={}, truncated=len(items), held=(), findings=()).encode()
    return text


MAX_UNREACHED = 64  # peers named in the annotation; past that the node reads as isolated
MAX_PROBED = 256  # a bounded peer set (healthd.blame.peersets) is far smaller


def ping_view(state: HealthState) -> PingView | None:
    """What this node's ping holds, for the controller's fleet-wide blame: the peers
    whose PEER_UNREACHABLE the verdict machine holds on the pod network (every other
    peer it probed counts as reached), or `isolated` while it holds NETWORK_ISOLATED;
    and the same per secondary network the latest run probed, under `networks` (left
    out when none was). Built from holdings, not from the latest raw run, so it moves
    only when the meaning does: a peer that misses one ping in five is no news until
    it is held, and it stays in the view as long as it is held (damping and release
    as for any finding). None while ping's latest run could not tell (or before it
    ran)."""
    name = reachability_check()
    ran = state.checks.get(name) if name is not None else None
    if ran is None or not ran.status.ordered:
        return None
    held = {(h.code, h.entity) for h in state.held if h.check == name}
    probed = _Probed(*(frozenset(_peer_of(label) for label in labels)
                       for labels in (ran.peers, ran.answered, ran.settled)))
    return PingView(_network_view(held, "", probed),
                    {n: _network_view(held, n, probed) for n in ran.networks})


@dataclass(frozen=True)
class _Probed:
    """(peer, network) pairs ping's latest run examined, those that answered, and
    those the run before examined too."""

    latest: frozenset[tuple[str, str]]
    answered: frozenset[tuple[str, str]]
    settled: frozenset[tuple[str, str]]

    def on(self, network: str) -> tuple[list[str], list[str]]:
        """(probed, reached) on `network`. A peer new to the set that did not answer
        is neither (its finding is pending, and a down peer must never read as
        reached); one probed before keeps counting as reached through one miss, so
        the view moves when a holding does, not with every lost echo."""
        probed = sorted(n for n, on in self.latest if n and on == network)
        reached = [n for n in probed if (n, network) in self.answered
                   or (n, network) in self.settled]
        return probed, reached


def reachability_check() -> str | None:
    """The check whose results are the node's view of its peers (the one that
    declares REACHABILITY: ping), if any is registered."""
    return next((name for name, cls in checks.REGISTRY.items() if cls.REACHABILITY), None)


def _network_view(held: set[tuple[str, str]], network: str, probed: _Probed) -> NetworkView:
    """One network's row from the (code, entity label) pairs ping holds: `network` ""
    is the pod network (isolation is held about the node), a name is a secondary
    network (isolation is held about `network/<name>`, a peer as `peer/<name>@<network>`).
    `reached`, so that blame knows whom a bounded peer set (healthd.blame.peersets)
    probed: the peers the latest run probed and counts as reached (see `_Probed.on`)
    and does not hold unreachable; while isolated, what each peer did in the latest
    run (the per-peer findings are not judged then, see checks.ping)."""
    isolated = ("NETWORK_ISOLATED", "node" if not network else f"network/{network}") in held
    peers = [_peer_of(entity) for code, entity in held if code == "PEER_UNREACHABLE"]
    unreached = sorted(name for name, on in peers if name and on == network)
    if len(unreached) > MAX_UNREACHED:
        return NetworkView(isolated=True)
    latest, reached = probed.on(network)
    if len(latest) > MAX_PROBED:  # not a bounded set: every peer it does not name
        return NetworkView(isolated=isolated, unreached=() if isolated else tuple(unreached))
    if isolated:  # what each peer did, as measured: the cut-off node's view is the news
        answered = [n for n in latest if (n, network) in probed.answered]
        return NetworkView(isolated=True, reached=tuple(answered),
                           unreached=tuple(n for n in latest if n not in answered))
    return NetworkView(isolated=False, unreached=tuple(unreached),
                       reached=tuple(n for n in reached if n not in unreached))


def _peer_of(label: str) -> tuple[str, str]:
    """(peer name, network) of an entity label `peer/<name>[@<network>]`; ("", "") for
    any other entity (node names cannot hold '/' or '@')."""
    kind, _, rest = label.partition("/")
    if kind != "peer":
        return "", ""
    name, _, network = rest.partition("@")
    return name, network


def _held_status(state: HealthState, key: str) -> Severity:
    """The worst severity check `key` holds the node at (PASS when nothing)."""
    return worst(h.severity for h in state.held if h.check == key) if any(
        h.check == key for h in state.held) else Severity.PASS


def _check_status(cs: CheckState, held: Severity) -> CheckStatus:
    """A check's published status: UNKNOWN/SKIPPED with the reason when its last run
    could not tell, else the severity it holds (a pending finding is no status yet)."""
    if cs.status.ordered:
        return CheckStatus(held.value, rfc3339(cs.at))
    return CheckStatus(cs.status.value, rfc3339(cs.at), _clip(cs.reason, MESSAGE_CHARS))


Item = Holding | Seen


def _ranked_items(state: HealthState) -> list[Item]:
    """Holdings and the other latest findings, most severe first (holdings before
    plain findings of the same severity)."""
    ranked: list[tuple[int, bool, Item]] = [
        (h.severity.rank, True, _holding(h)) for h in state.held]
    for key, findings in sorted(state.check_findings.items()):
        for f in findings:  # recorded-only ones: held ones are above, pending ones wait
            if f.severity.rank < Severity.WARN.rank:
                ranked.append((f.severity.rank, False, _seen(key, f)))
    ranked.sort(key=lambda r: (-r[0], not r[1]))
    return [item for _, _, item in ranked]


def _holding(h: Held) -> Holding:
    return Holding(code=h.code, check=h.check, entity=h.entity, severity=h.severity.value,
                   sticky=h.sticky, message=_clip(h.message, MESSAGE_CHARS),
                   since=rfc3339(h.since), uuid=h.uuid, clear_requested=h.clear_requested,
                   flaps=h.flaps)


def _seen(key: str, f: Finding) -> Seen:
    return Seen(code=f.code, check=key, entity=f.entity.label, severity=f.severity.value,
                message=_clip(f.message, MESSAGE_CHARS))


def _fit(head: Health, items: list[Item], limit: int) -> list[Item]:
    """The longest most-severe-first prefix of `items` that fits in `limit` bytes."""
    budget = limit - len(replace(head, truncated=99999).encode())
    kept: list[Item] = []
    for item in items:
        entry = holding_json(item) if isinstance(item, Holding) else seen_json(item)
        cost = len(dumps(entry)) + 1  # the separating comma
        if cost > budget:
            break
        budget -= cost
        kept.append(item)
    return kept


# -- verdict transitions ---------------------------------------------------------------


@dataclass(frozen=True)
class Announcement:
    """One Event about a verdict transition."""

    type: str  # "Warning" or "Normal"
    reason: str
    message: str


def announcement(old: Verdict, new_state: HealthState, old_state: HealthState | None) -> (
        Announcement | None):
    """The Event for a verdict change from `old` to `new_state.verdict`, or None when
    nothing changed. Worse is a Warning whose reason is the top finding code; better
    (and entering a planned diagnostic) is Normal."""
    new = new_state.verdict
    if new is old:
        return None
    head = f"GPU health {old.value} -> {new.value}"
    if new is Verdict.TESTING:
        return Announcement("Normal", Reason.TESTING.value,
                            f"{head}: exclusive diagnostic running: {_testing(new_state)}")
    top = new_state.top
    if new.precedence > old.precedence and top is not None:
        text = describe_held(top) + _more(len(new_state.held) - 1)
        return Announcement("Warning", top.code, _clip(f"{head}: {text}", CONDITION_MESSAGE_CHARS))
    reason = Reason.HEALTHY if new is Verdict.PASS else Reason.RECOVERED
    text = _clip(f"{head}: {_recovery(new_state, old_state)}", CONDITION_MESSAGE_CHARS)
    return Announcement("Normal", reason.value, text)


def _recovery(new_state: HealthState, old_state: HealthState | None) -> str:
    """What went away, and what still holds the node."""
    released = _released(old_state.held if old_state else (), new_state.held)
    parts = [f"released {_codes(released)}"] if released else []
    if not released and old_state is not None and old_state.testing - new_state.testing:
        parts.append(f"diagnostic {', '.join(sorted(old_state.testing - new_state.testing))} ended")
    if new_state.top is not None:
        parts.append(f"still held: {_codes(new_state.held)}")
    return "; ".join(parts) or "no finding holds the node"


def _released(before: Iterable[Held], after: Iterable[Held]) -> list[Held]:
    now = {(h.check, h.code, h.entity) for h in after}
    return [h for h in before if (h.check, h.code, h.entity) not in now]


def _codes(held: list[Held] | tuple[Held, ...], shown: int = 3) -> str:
    named = [
        f"{h.code} on {describe_entity(h.entity, h.uuid)}"
        for h in held[:shown]
    ]
    return ", ".join(named) + _more(len(held) - shown)

