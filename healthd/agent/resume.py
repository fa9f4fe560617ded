"""What a restarted agent takes back from its Node before it judges or writes.

The published state is the agent's memory: an agent process may be replaced at any
time (a rollout, an OOM kill, a drain), and what it learnt once (an NVML XID, which
NVML delivers once; a kernel-log line already read; a DCGM result) is nowhere else.
So before its first write the agent reads its Node and resumes:

- the holdings in the `health` annotation (read through the one bounded decoder):
  sticky ones stay until a clear, damped ones keep their flaps (the hold grows with
  them) and count their clean runs again from zero. The longest silence of a noisy
  signal (`gap`) is not published, since it moves with every swing and would write
  in a steady state; a resumed hold is at least what its flaps make it;
- each check's last published status, so the first round rewrites nothing that did
  not change;
- the exclusive diagnostics it showed running (`testing`): the node stays TESTING
  until the agent has found their Jobs and followed them to their end, or found none
  (healthd.agent.deepresume);
- the label: ERR or EVICT on the label that the resumed holdings do not explain (the
  annotation is missing, garbage, or says less) is held as `VERDICT_RESUMED` at that
  severity until an admin clears it. A verdict is never turned into a PASS by an
  unreadable annotation.

What cannot be resumed is refused with a reason (logged as a warning): a holding with
a severity healthd does not know or below WARN, one of a check healthd does not have
(another version's), a time that is not one. Pure: the agent logs the notes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from checks.base import Severity
from healthd.agent.node_view import reachability_check
from healthd.agent.verdict import RESUMED, CheckState, Held, Trigger
from healthd.capacity.health import verdict_of
from healthd.kube.conventions import Keys, Verdict
from healthd.kube.shapes import Node, view
from healthd.published import (
    REPAIR_TESTING,
    CheckStatus,
    Health,
    Holding,
    NetworkView,
    Undecodable,
    read_health,
)
from healthd.util.times import parse_time

RESUMED_CODE = "VERDICT_RESUMED"

# The severity each unhealthy label value stands for.
_LABEL_SEVERITY = {Verdict.ERR: Severity.ERR, Verdict.EVICT: Severity.EVICT}


@dataclass(frozen=True)
class Resumed:
    """What the Node showed, as the verdict machine takes it (`verdict.resume`)."""

    held: tuple[Held, ...] = ()
    checks: Mapping[str, CheckState] = field(default_factory=lambda: MappingProxyType({}))
    shown: Verdict | None = None  # the verdict label (None: none, or not one of ours)
    since: float | None = None  # when the Node's verdict last changed
    notes: tuple[str, ...] = ()  # what was not resumed, and why
    testing: frozenset[str] = frozenset()  # exclusive diagnostics the Node showed running


def resumed_from(node: Mapping[str, Any], keys: Keys, *, known: Callable[[str], bool],
                 at: float) -> Resumed:
    """What to resume from `node` (its label and `health` annotation). `known(key)`:
    whether this agent can run check `key` (a holding of another is refused); `at`:
    now, for times the Node does not give."""
    shown = verdict_of(view(Node, node), keys)
    doc = read_health(node, keys)
    notes: list[str] = []
    held: list[Held] = []
    checks: dict[str, CheckState] = {}
    since = None
    if isinstance(doc, Undecodable):
        notes.append(f"the health annotation cannot be read ({doc.why})")
    elif doc is not None:
        held = [h for item in doc.held if (h := _held(item, known, at, notes)) is not None]
        checks = {key: cs for key, entry in doc.checks.items()
                  if known(key) and (cs := _check(entry, at)) is not None}
        since = parse_time(doc.since)
        checks = _with_probed(checks, doc)
    unexplained = _unexplained(shown, held, doc, at)
    if unexplained is not None:
        held.append(unexplained)
    return Resumed(tuple(held), MappingProxyType(checks), shown, since, tuple(notes),
                   _diagnostics(doc, known))


def diagnostics_shown(node: Mapping[str, Any], keys: Keys, *,
                      known: Callable[[str], bool]) -> frozenset[str]:
    """The check keys of the exclusive diagnostics `node` shows running (`testing` in
    its health document, the repair's key left out), of checks this agent has."""
    return _diagnostics(read_health(node, keys), known)


def _diagnostics(doc: Health | Undecodable | None,
                 known: Callable[[str], bool]) -> frozenset[str]:
    if not isinstance(doc, Health):
        return frozenset()
    return frozenset(key for key in doc.testing if key != REPAIR_TESTING and known(key))


def _with_probed(checks: dict[str, CheckState], doc: Health) -> dict[str, CheckState]:
    """The ping check's status with the peers its published view names, so the view
    the first round publishes is the one the Node shows (not "probed nobody")."""
    key = reachability_check()
    ran = checks.get(key) if key is not None else None
    if key is None or ran is None or doc.ping is None:
        return checks
    views = [("", doc.ping.pod), *doc.ping.networks.items()]

    def labels(names: Callable[[NetworkView], tuple[str, ...]]) -> tuple[str, ...]:
        return tuple(sorted(f"peer/{name}@{network}" if network else f"peer/{name}"
                            for network, v in views if v.reached is not None
                            for name in names(v)))
    probed = labels(lambda v: (*(v.reached or ()), *v.unreached))
    return {**checks, key: replace(ran, peers=probed, settled=probed,
                                   answered=labels(lambda v: v.reached or ()))}


def _held(item: Holding, known: Callable[[str], bool], at: float,
          notes: list[str]) -> Held | None:
    """One published holding as the verdict machine's, or None (with a note why)."""
    what = f"holding {item.code or '?'} of {item.check or '?'} on {item.entity or '?'}"
    severity = _severity(item.severity)
    if not (item.code and item.check and item.entity):
        notes.append(f"{what}: code, check and entity are required")
        return None
    if severity is None or severity.rank < Severity.WARN.rank:
        notes.append(f"{what}: severity {item.severity!r} holds nothing")
        return None
    if item.check != RESUMED and not known(item.check):
        notes.append(f"{what}: this agent has no check {item.check!r}")
        return None
    since = parse_time(item.since)
    return Held(item.code, item.check, item.entity, severity, item.sticky, item.message,
                since=min(since, at) if since is not None else at,
                clear_requested=item.clear_requested, flaps=max(item.flaps, 0), uuid=item.uuid)


def _check(entry: CheckStatus, at: float) -> CheckState | None:
    status = _severity(entry.status)
    if status is None:
        return None
    when = parse_time(entry.at)
    return CheckState(status, when if when is not None else at, Trigger.PERIODIC, entry.reason)


def _unexplained(shown: Verdict | None, held: list[Held], doc: Health | Undecodable | None,
                 at: float) -> Held | None:
    """A holding for an ERR or EVICT label that no resumed holding explains."""
    severity = _LABEL_SEVERITY.get(shown) if shown is not None else None
    if severity is None or any(h.severity.rank >= severity.rank for h in held):
        return None
    assert shown is not None
    why = ("it has none" if doc is None else
           f"it cannot be read ({doc.why})" if isinstance(doc, Undecodable) else
           "it holds nothing that severe")
    since = parse_time(doc.since) if isinstance(doc, Health) else None
    return Held(RESUMED_CODE, RESUMED, "node", severity, sticky=True,
                message=(f"the node showed {shown.value} when the agent started, and its "
                         f"health annotation does not say why ({why}); held until "
                         f"healthd.io/clear"),
                since=since if since is not None else at)


def _severity(value: str) -> Severity | None:
    try:
        return Severity(value)
    except ValueError:
        return None
