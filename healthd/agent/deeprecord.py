"""What a diagnostic Job carries so that whichever agent runs on the node can finish it.

An exclusive diagnostic (`dcgm:3`) runs for minutes, up to an hour: longer than an
agent process may live (a rollout, an OOM kill). So the run belongs to the node, not
to the process, and its Job is its record: the `healthd.io/diagnostic-run` annotation
says what the run is for. The agent that finds the Job (healthd.agent.deepresume)
finishes the run as its starter would have: the result goes into the verdict under
the trigger that started it, and the request that asked for it is answered once, with
its id, from when it was taken, with the results of its checks that ran before the
diagnostic.

    diagnostic-run  key, trigger, start, [request{id, text, kind}], [done{}], [rest[]]
      done{}        per check key: {status, [reason]} or {not_run}
      rest[]        the request's exclusive checks still to run after this one

Decoding is tolerant, as in healthd.published: text that is no JSON object is
`Undecodable`, an odd entry of `done` is left out on its own, and a record without a
check key finishes nothing (the Job is removed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from checks.base import CheckResult, Severity
from healthd.agent.verdict import Trigger
from healthd.kube.conventions import Keys
from healthd.kube.objects import as_dict, as_list
from healthd.published import Document, Json, Undecodable
from healthd.requests import Request
from healthd.util.times import parse_time, rfc3339

Results = Mapping[str, CheckResult | str]  # per check key: its result, or why it did not run

REASON_CHARS = 1000  # a reason in the record stays bounded, as in last-run
NOT_RUN_AFTER_RESTART = "the agent that took the request stopped before it ran"


@dataclass(frozen=True)
class Asked:
    """The request a run answers, and when the agent took it."""

    request: Request
    start: float


@dataclass(frozen=True)
class DeepRecord(Document):
    """The `diagnostic-run` annotation of a diagnostic Job (see the module docstring)."""

    key: str  # the check key the Job runs (`dcgm:3`)
    trigger: str  # what started the run (healthd.agent.verdict.Trigger)
    start: str  # RFC 3339 (microseconds): when the run, or the request it answers, began
    request: Request | None = None  # the request to answer (None: a scheduled run)
    done: Results = field(default_factory=lambda: MappingProxyType({}))
    rest: tuple[str, ...] = ()

    @classmethod
    def of(cls, key: str, trigger: Trigger, *, asked: Asked | None, at: float,
           done: Results | None = None, rest: tuple[str, ...] = ()) -> DeepRecord:
        """The record of a run of `key` started at `at` (or for `asked`, from when it
        was taken), after the request's checks `done`, before its `rest`."""
        return cls(key, trigger.value, rfc3339(asked.start if asked else at, digits=6),
                   asked.request if asked else None, MappingProxyType(dict(done or {})), rest)

    @property
    def run_trigger(self) -> Trigger:
        """The trigger the result is judged under (a periodic run when unreadable)."""
        try:
            return Trigger(self.trigger)
        except ValueError:
            return Trigger.PERIODIC

    def started(self, default: float) -> float:
        """When the run (or its request) began, as epoch seconds; `default` if unknown."""
        at = parse_time(self.start)
        return at if at is not None else default

    def results(self, result: CheckResult) -> dict[str, CheckResult | str]:
        """What the answer reports: the checks done before, this run's `result`, and
        the request's exclusive checks that never ran."""
        return {**self.done, self.key: result, **dict.fromkeys(self.rest, NOT_RUN_AFTER_RESTART)}

    def to_json(self) -> Json:
        body: Json = {"key": self.key, "trigger": self.trigger, "start": self.start}
        if self.request is not None:
            body["request"] = {"id": self.request.id, "text": self.request.text,
                               "kind": self.request.kind}
        if self.done:
            body["done"] = {key: _done_json(value) for key, value in self.done.items()}
        if self.rest:
            body["rest"] = list(self.rest)
        return body

    @classmethod
    def from_json(cls, body: Json) -> DeepRecord:
        return cls(key=_text(body.get("key")), trigger=_text(body.get("trigger")),
                   start=_text(body.get("start")), request=_request_from(body.get("request")),
                   done=MappingProxyType(_done_map(as_dict(body.get("done")))),
                   rest=tuple(k for k in as_list(body.get("rest")) if isinstance(k, str) and k))


def read_record(job: Mapping[str, Any], keys: Keys) -> DeepRecord | Undecodable | None:
    """The Job's record; None when it has none; Undecodable when it cannot be read."""
    return DeepRecord.read(job, keys.diagnostic_run)


def _done_json(value: CheckResult | str) -> Json:
    if isinstance(value, str):
        return {"not_run": value[:REASON_CHARS]}
    body: Json = {"status": value.status.value}
    if value.reason:
        body["reason"] = value.reason[:REASON_CHARS]
    return body


def _done_map(body: Json) -> dict[str, CheckResult | str]:
    out: dict[str, CheckResult | str] = {}
    for key, item in body.items():
        value = _done_from(str(key), item)
        if value is not None:
            out[str(key)] = value
    return out


def _done_from(key: str, item: object) -> CheckResult | str | None:
    """One entry of `done` as the answer takes it; None when it is not one."""
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("not_run"), str):
        return str(item["not_run"])
    try:
        status = Severity(_text(item.get("status")))
    except ValueError:
        return None
    return CheckResult(check=key.partition(":")[0], status=status,
                       reason=_text(item.get("reason")))


def _request_from(value: object) -> Request | None:
    if not isinstance(value, dict):
        return None
    request_id, kind = _text(value.get("id")), value.get("kind")
    if not request_id or kind not in ("run", "clear"):
        return None
    return Request(request_id, _text(value.get("text")), "run" if kind == "run" else "clear")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
