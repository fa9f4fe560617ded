"""The documents healthd publishes on a Node, as frozen models: the `health`
annotation (with its ping view), the `last-run` answer to an on-demand request, the
`repair` record and the `clearing` clear in flight.

The agent writes the `health`, `last-run` and `clearing` documents
(healthd.agent.node_view, healthd.requests, healthd.agent.ondemand), the
controller the `repair` annotation (its repairs); the controller,
`healthd status`, `healthd trigger`, network blame and the demo read them, all
through this module. Their JSON is a published interface (dashboards and other
tools read it too), so `encode` writes exactly what earlier releases wrote: compact,
ASCII-escaped, keys in the order below, an optional key only when it says something.
A field may be added; none changes meaning.

    health      verdict, since, top, [testing], [ping], held[], findings[], checks{},
                [truncated]
      held[]    code, check, entity, severity, sticky, message, since, [uuid],
                [clear_requested], [flaps]
      findings[] code, check, entity, severity, message
      checks{}  per check key: status, at, [reason]
      ping      isolated, unreached[], [networks{name: {isolated, unreached[]}}]
    last-run    id, request, kind, accepted, error, start, end, duration_s, verdict,
                checks{}, reasons{}, [request_chars]
    repair      state, since, [reason], [gpus[]], [job], [run_id], [boot_id],
                [request], [checks[]], attempts[]
      attempts[] remedy, at, [gpus[]], outcome
    clearing    id, request, start

Decoding is tolerant, as a reader of a shared interface must be: annotations are
anyone's to write (node-patch rights, an older or a newer agent). The text goes
through the bounded decoder (`healthd.kube.objects.bounded_json`), so garbage and
deeply nested JSON stay harmless; text that is no JSON object decodes to an
`Undecodable` saying why, never to an exception. Inside an object a field that is
absent or of the wrong type reads as its default, and a list item or map entry that
is not what it should be is left out on its own, so one odd field never hides the
rest. Values are kept as written (a verdict, a severity, a time): a reader from an
older release still shows what a newer agent wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Self, TypeVar

from healthd.kube.conventions import Keys
from healthd.kube.objects import (
    Unreadable,
    as_dict,
    as_list,
    bounded_json,
    dicts,
    read_annotation_json,
)

T = TypeVar("T")
Json = dict[str, Any]


@dataclass(frozen=True)
class Undecodable:
    """A document that cannot be read, and why (too large, too deep, not JSON, not a
    JSON object)."""

    why: str


def _frozen(items: Mapping[str, T] | None = None) -> Mapping[str, T]:
    return MappingProxyType(dict(items or {}))


class Document:
    """What both documents share: the published JSON form, and tolerant reading."""

    def to_json(self) -> Json:
        raise NotImplementedError

    @classmethod
    def from_json(cls, body: Json) -> Self:
        """The document in a decoded JSON object (see the module docstring)."""
        raise NotImplementedError

    def encode(self) -> str:
        return dumps(self.to_json())

    @classmethod
    def decode(cls, text: str | bytes) -> Self | Undecodable:
        try:
            body = bounded_json(text)
        except Unreadable as exc:
            return Undecodable(str(exc))
        return cls.from_json(body) if isinstance(body, dict) else Undecodable(
            "not a JSON object")

    @classmethod
    def read(cls, obj: Mapping[str, Any], key: str) -> Self | Undecodable | None:
        """The document in annotation `key` of `obj`; None when there is none (no
        annotation, or an empty object); Undecodable when it cannot be read."""
        body, why = read_annotation_json(obj, key)
        if why:
            return Undecodable(why)
        return cls.from_json(body) if body else None


# -- the health annotation -------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """One finding that holds the verdict (`held[]`), most severe first."""

    code: str
    check: str  # the check key that reported it ("remapped", "dcgm:3")
    entity: str  # "gpu3", "node", "peer/n2", "peer/n2@net1", "network/net1"
    severity: str
    sticky: bool
    message: str
    since: str  # RFC 3339: when it was first held
    uuid: str = ""
    clear_requested: bool = False
    flaps: int = 0  # times it came back soon after a release

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a holding: (check key, code, entity)."""
        return (self.check, self.code, self.entity)


@dataclass(frozen=True)
class Seen:
    """A latest finding that holds nothing (`findings[]`): below WARN."""

    code: str
    check: str
    entity: str
    severity: str
    message: str


@dataclass(frozen=True)
class CheckStatus:
    """One check key's published status (`checks{}`): what it holds, or UNKNOWN/SKIPPED
    with the reason its last run could not tell."""

    status: str
    at: str  # RFC 3339: when that status was first seen
    reason: str = ""


@dataclass(frozen=True)
class NetworkView:
    """What ping holds about one network: the peers it cannot reach, or that it is
    cut off (`isolated`)."""

    isolated: bool = False
    unreached: tuple[str, ...] = ()
    # The peers it reached, when it probes a bounded peer set (None: it probed every
    # other node, and every one it does not name was reached).
    reached: tuple[str, ...] | None = None

    def to_json(self) -> Json:
        out: Json = {"isolated": self.isolated, "unreached": list(self.unreached)}
        if self.reached is not None:
            out["reached"] = list(self.reached)
        return out


@dataclass(frozen=True)
class PingView:
    """The ping view (`ping`): the pod network's row, then each secondary network's."""

    pod: NetworkView = NetworkView()
    networks: Mapping[str, NetworkView] = field(default_factory=_frozen)

    def to_json(self) -> Json:
        out = self.pod.to_json()
        if self.networks:
            out["networks"] = {name: v.to_json() for name, v in self.networks.items()}
        return out


@dataclass(frozen=True)
class Health(Document):
    """The `health` annotation: what the verdict means, not what the last run measured."""

    verdict: str  # a Verdict's value, or UNKNOWN before any judgement
    since: str  # RFC 3339: when the verdict last changed
    top: str | None = None  # the top holding's code
    testing: tuple[str, ...] = ()  # exclusive diagnostics running
    ping: PingView | None = None  # None: ping cannot tell (or is not configured)
    held: tuple[Holding, ...] = ()
    findings: tuple[Seen, ...] = ()
    checks: Mapping[str, CheckStatus] = field(default_factory=_frozen)
    truncated: int | None = None  # findings left out to stay under the size bound

    def to_json(self) -> Json:
        body: Json = {"verdict": self.verdict, "since": self.since, "top": self.top}
        if self.testing:
            body["testing"] = list(self.testing)
        if self.ping is not None:
            body["ping"] = self.ping.to_json()
        body["held"] = [holding_json(h) for h in self.held]
        body["findings"] = [seen_json(s) for s in self.findings]
        body["checks"] = {key: _check_json(c) for key, c in self.checks.items()}
        if self.truncated is not None:
            body["truncated"] = self.truncated
        return body

    @classmethod
    def from_json(cls, body: Json) -> Health:
        return cls(
            verdict=_str(body, "verdict"),
            since=_str(body, "since"),
            top=body["top"] if isinstance(body.get("top"), str) else None,
            testing=_strings(body.get("testing")),
            ping=ping_from(body.get("ping")),
            held=tuple(_holding_from(item) for item in dicts(body.get("held"))),
            findings=tuple(_seen_from(item) for item in dicts(body.get("findings"))),
            checks=_frozen({str(k): _check_from(v)
                            for k, v in as_dict(body.get("checks")).items()
                            if isinstance(v, dict)}),
            truncated=_int(body, "truncated"))


def holding_json(h: Holding) -> Json:
    out: Json = {"code": h.code, "check": h.check, "entity": h.entity,
                 "severity": h.severity, "sticky": h.sticky, "message": h.message,
                 "since": h.since}
    if h.uuid:
        out["uuid"] = h.uuid
    if h.clear_requested:
        out["clear_requested"] = True
    if h.flaps:
        out["flaps"] = h.flaps
    return out


def seen_json(s: Seen) -> Json:
    return {"code": s.code, "check": s.check, "entity": s.entity, "severity": s.severity,
            "message": s.message}


def _check_json(c: CheckStatus) -> Json:
    out: Json = {"status": c.status, "at": c.at}
    if c.reason:
        out["reason"] = c.reason
    return out


def _holding_from(item: Json) -> Holding:
    return Holding(code=_str(item, "code"), check=_str(item, "check"),
                   entity=_str(item, "entity"), severity=_str(item, "severity"),
                   sticky=item.get("sticky") is True, message=_str(item, "message"),
                   since=_str(item, "since"), uuid=_str(item, "uuid"),
                   clear_requested=item.get("clear_requested") is True,
                   flaps=_int(item, "flaps") or 0)


def _seen_from(item: Json) -> Seen:
    return Seen(code=_str(item, "code"), check=_str(item, "check"),
                entity=_str(item, "entity"), severity=_str(item, "severity"),
                message=_str(item, "message"))


def _check_from(item: Json) -> CheckStatus:
    return CheckStatus(status=_str(item, "status"), at=_str(item, "at"),
                       reason=_str(item, "reason"))


def ping_from(value: object) -> PingView | None:
    """The ping view; None when absent or when its pod-network row is malformed (a
    malformed secondary network is left out on its own)."""
    pod = _network_from(value)
    if pod is None or not isinstance(value, dict):
        return None
    networks = {str(name): view for name, raw in as_dict(value.get("networks")).items()
                if (view := _network_from(raw)) is not None}
    return PingView(pod, _frozen(networks))


def _network_from(value: object) -> NetworkView | None:
    """One network's row: None unless `isolated` is a bool (or absent) and, for a
    network that is not isolated, `unreached` a list (or absent)."""
    if not isinstance(value, dict) or not isinstance(value.get("isolated", False), bool):
        return None
    unreached = value.get("unreached", [])
    reached = value.get("reached")
    if reached is not None and not isinstance(reached, list):
        return None
    kept = _strings(reached) if reached is not None else None
    if value.get("isolated"):
        return NetworkView(True, _strings(unreached), kept)
    if not isinstance(unreached, list):
        return None
    return NetworkView(False, _strings(unreached), kept)


# -- the last-run annotation -----------------------------------------------------------


@dataclass(frozen=True)
class LastRun(Document):
    """The `last-run` annotation: the answer to the latest on-demand request."""

    id: str  # the request's id (`healthd.io/run-id`, or derived)
    request: str  # its text, clipped
    kind: str  # "run" or "clear"
    accepted: bool
    error: str  # why it was refused ("" when accepted)
    start: str  # RFC 3339, whole seconds
    end: str
    duration_s: float | None  # exact; None when an answer does not say
    verdict: str  # the verdict after the run
    checks: Mapping[str, str] = field(default_factory=_frozen)  # check -> status
    reasons: Mapping[str, str] = field(default_factory=_frozen)  # check -> why UNKNOWN
    request_chars: int | None = None  # the request's full length, when clipped

    def to_json(self) -> Json:
        body: Json = {"id": self.id, "request": self.request, "kind": self.kind,
                      "accepted": self.accepted, "error": self.error, "start": self.start,
                      "end": self.end, "duration_s": self.duration_s,
                      "verdict": self.verdict, "checks": dict(self.checks),
                      "reasons": dict(self.reasons)}
        if self.request_chars is not None:
            body["request_chars"] = self.request_chars
        return body

    @classmethod
    def from_json(cls, body: Json) -> LastRun:
        duration = body.get("duration_s")
        return cls(
            id=_str(body, "id"), request=_str(body, "request"), kind=_str(body, "kind"),
            accepted=body.get("accepted") is True, error=_str(body, "error"),
            start=_str(body, "start"), end=_str(body, "end"),
            duration_s=float(duration) if isinstance(duration, int | float) and not isinstance(
                duration, bool) else None,
            verdict=_str(body, "verdict"),
            checks=_text_map(body.get("checks")), reasons=_text_map(body.get("reasons")),
            request_chars=_int(body, "request_chars"))


# -- the repair annotation ---------------------------------------------------------------

REPAIR_STATES = ("", "waiting", "held", "resetting", "validating", "reboot-requested",
                 "hardware-inspection")
# While a repair holds the GPUs or checks them, the node shows TESTING, under this key
# in the health document's `testing[]` (beside any exclusive diagnostic's check key).
TESTING_REPAIR_STATES = frozenset({"resetting", "validating"})
# While a repair is in one of these states, it holds the node until the controller
# closes it: an admin's clear releases nothing meanwhile (healthd.agent.ondemand).
HOLDING_REPAIR_STATES = TESTING_REPAIR_STATES | {"reboot-requested"}
REPAIR_TESTING = "repair"
REBOOT_NEEDED = "reboot needed"  # how a `held` repair's reason starts when only a reboot helps


@dataclass(frozen=True)
class RepairAttempt:
    """One repair carried out or requested (`attempts[]`), oldest first."""

    remedy: str  # "reset" or "reboot"
    at: str  # RFC 3339: when it was started (the Job created, the request made)
    gpus: tuple[str, ...] = ()  # the GPUs reset (UUIDs)
    # "" while in progress; "passed", "failed", "timed-out", or "refused" (a reset that
    # something still holding the GPUs kept from running: not spent from the budget)
    outcome: str = ""
    ended: str = ""  # RFC 3339: when the outcome was known (the next attempt's pause)
    note: str = ""  # what the outcome said, clipped (a refusal names what held the GPUs)

    def to_json(self) -> Json:
        body: Json = {"remedy": self.remedy, "at": self.at}
        if self.gpus:
            body["gpus"] = list(self.gpus)
        body["outcome"] = self.outcome
        if self.ended:
            body["ended"] = self.ended
        if self.note:
            body["note"] = self.note
        return body

    @classmethod
    def from_json(cls, body: Json) -> RepairAttempt:
        return cls(remedy=_str(body, "remedy"), at=_str(body, "at"),
                   gpus=_strings(body.get("gpus")), outcome=_str(body, "outcome"),
                   ended=_str(body, "ended"), note=_str(body, "note"))


@dataclass(frozen=True)
class Repair(Document):
    """The `repair` annotation: where the node's repair stands, and what was tried.
    Written by the controller only; the state lives here, in the cluster, so a new
    leader neither repeats nor loses a step."""

    state: str  # one of REPAIR_STATES ("" : nothing in progress)
    since: str  # RFC 3339: when the state was entered
    reason: str = ""  # why (a decision's reason, a failure)
    gpus: tuple[str, ...] = ()  # the GPUs the step is about
    job: str = ""  # the GPU reset Job (namespace/name) while resetting
    run_id: str = ""  # the validation request's id while validating
    boot_id: str = ""  # the node's boot id when a reboot was requested
    request: str = ""  # the reboot request object (kind namespace/name)
    attempts: tuple[RepairAttempt, ...] = ()
    checks: tuple[str, ...] = ()  # the check keys that raised the findings being repaired
    started: str = ""  # RFC 3339: when the GPU-reset Job was created (all had let go)
    # While resetting: the GPU Operator's operand labels the controller set to "false"
    # on the node, with the values it found, to be put back whatever the outcome.
    operands: Mapping[str, str] = field(default_factory=_frozen)

    @property
    def testing(self) -> bool:
        return self.state in TESTING_REPAIR_STATES

    @property
    def holds_node(self) -> bool:
        """Whether the repair holds the node until the controller closes it: it resets
        or validates the GPUs, or waits for the reboot it requested."""
        return self.state in HOLDING_REPAIR_STATES

    @property
    def resetting(self) -> bool:
        """Whether the GPU-reset Job may run: the agent lets go of NVML meanwhile."""
        return self.state == "resetting"

    @property
    def doing(self) -> str:
        """What the repair does now, for a person: `resetting GPU-1, GPU-2`."""
        gpus = ", ".join(self.gpus)
        return f"{self.state} {gpus}" if gpus and self.state == "resetting" else self.state

    @property
    def note(self) -> str:
        """What the node's condition says of the repair while the node is out and not
        TESTING: a reboot needed, requested, or hardware inspection; else ""."""
        if self.state == "held" and self.reason.startswith(REBOOT_NEEDED):
            return REBOOT_NEEDED
        if self.state == "reboot-requested":
            return f"reboot requested ({self.request})" if self.request else "reboot requested"
        return "hardware inspection" if self.state == "hardware-inspection" else ""

    def to_json(self) -> Json:
        body: Json = {"state": self.state, "since": self.since}
        for key in ("reason", "job", "started", "run_id", "boot_id", "request"):
            if getattr(self, key):
                body[key] = getattr(self, key)
        if self.gpus:
            body["gpus"] = list(self.gpus)
        if self.checks:
            body["checks"] = list(self.checks)
        if self.operands:
            body["operands"] = dict(self.operands)
        body["attempts"] = [a.to_json() for a in self.attempts]
        return body

    @classmethod
    def from_json(cls, body: Json) -> Repair:
        return cls(state=_str(body, "state"), since=_str(body, "since"),
                   reason=_str(body, "reason"), gpus=_strings(body.get("gpus")),
                   job=_str(body, "job"), started=_str(body, "started"),
                   run_id=_str(body, "run_id"),
                   boot_id=_str(body, "boot_id"), request=_str(body, "request"),
                   attempts=tuple(RepairAttempt.from_json(item)
                                  for item in dicts(body.get("attempts"))),
                   checks=_strings(body.get("checks")),
                   operands=_text_map(body.get("operands")))


# -- the clearing annotation -------------------------------------------------------------


@dataclass(frozen=True)
class Clearing(Document):
    """The `clearing` annotation: a clear the agent took and has not answered yet. It
    is written in the patch that takes the clear and removed in the write that
    answers it, so an agent that stops in between leaves it to the next one, which
    carries the clear out and answers it under the same id."""

    id: str  # the clear's id (`healthd.io/run-id` written with it, or derived)
    request: str  # its text
    start: str  # RFC 3339: when it was taken

    def to_json(self) -> Json:
        return {"id": self.id, "request": self.request, "start": self.start}

    @classmethod
    def from_json(cls, body: Json) -> Clearing:
        return cls(id=_str(body, "id"), request=_str(body, "request"),
                   start=_str(body, "start"))


# -- reading them from an object -------------------------------------------------------


def read_health(obj: Mapping[str, Any], keys: Keys) -> Health | Undecodable | None:
    """The node's health document; None when it publishes none (no annotation, or an
    empty object); Undecodable when the annotation cannot be read."""
    return Health.read(obj, keys.health)


def read_last_run(obj: Mapping[str, Any], keys: Keys) -> LastRun | Undecodable | None:
    """The node's last-run answer, as `read_health` reads the health document."""
    return LastRun.read(obj, keys.last_run)


def read_repair(obj: Mapping[str, Any], keys: Keys) -> Repair | Undecodable | None:
    """The node's repair document, as `read_health` reads the health document."""
    return Repair.read(obj, keys.repair)


def read_clearing(obj: Mapping[str, Any], keys: Keys) -> Clearing | Undecodable | None:
    """The clear the node's agent took and has not answered, as `read_health` reads
    the health document."""
    return Clearing.read(obj, keys.clearing)


def awaits_validation(obj: Mapping[str, Any], keys: Keys) -> bool:
    """Whether the node is new to healthd's repairs: no repair record, and no verdict
    published yet other than one that awaits this validation (`testing` holds the
    repair's key). A node judged before (a fleet that turns the validation of new
    nodes on) is not new. The agent and the controller read it the same way."""
    if read_repair(obj, keys) is not None:
        return False
    health = read_health(obj, keys)
    return health is None or (isinstance(health, Health) and REPAIR_TESTING in health.testing)


# -- JSON plumbing ---------------------------------------------------------------------


def dumps(body: Mapping[str, Any]) -> str:
    """Compact, ASCII-escaped JSON in the order given: the published form."""
    return json.dumps(body, separators=(",", ":"))


def _str(body: Json, key: str) -> str:
    value = body.get(key)
    return value if isinstance(value, str) else ""


def _int(body: Json, key: str) -> int | None:
    value = body.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _strings(value: object) -> tuple[str, ...]:
    """The non-empty strings of a list; () for anything else."""
    return tuple(v for v in as_list(value) if isinstance(v, str) and v)


def _text_map(value: object) -> Mapping[str, str]:
    return _frozen({str(k): v for k, v in as_dict(value).items() if isinstance(v, str)})


