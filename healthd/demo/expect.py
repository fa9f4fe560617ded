"""Judging a scenario's `wait_for` against what the cluster shows (pure).

`judge(expect, state, events)` says whether the expectation holds in this observed
state and, either way, what was seen (the text a failed scenario reports), so a
failure reads "expected gpu-node-2 verdict EVICT; saw PASS". `held_since` says since
when an expectation has held, from the recorded states and Events (what a scenario's
`timings` measure).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from healthd.demo.observe import NONE, State
from healthd.demo.scenario import EventExpect, Expect, LastRunExpect, LendingExpect

Verdict = tuple[bool, str]  # (holds, what was seen)


def describe(expect: Expect) -> str:
    """The expectation in words (for logs and failure messages)."""
    if expect.node is not None:
        parts = [f"verdict {expect.verdict.value}" if expect.verdict else "",
                 f"cordoned={expect.cordoned}" if expect.cordoned is not None else "",
                 f"finding {expect.finding}" if expect.finding else "",
                 f"blamed on {expect.blamed_on or 'no network'}"
                 if expect.blamed_on is not None else "",
                 _describe_last_run(expect.last_run) if expect.last_run else ""]
        return f"node {expect.node} " + ", ".join(p for p in parts if p)
    if expect.appwrapper is not None:
        parts = [f"phase {expect.phase}" if expect.phase else "",
                 f"on {sorted(expect.on_nodes)}" if expect.on_nodes is not None else "",
                 f"not on {sorted(expect.not_on)}" if expect.not_on else ""]
        return f"AppWrapper {expect.appwrapper} " + ", ".join(p for p in parts if p)
    if expect.lending_limit is not None:
        lend = expect.lending_limit
        value = NONE if lend.value is None else str(lend.value)
        return f"{lend.queue} {lend.resource} lendingLimit {value}"
    if expect.event is not None:
        ev = expect.event
        about = f" on {ev.object}" if ev.object else ""
        return f"{ev.type or 'an'} Event {ev.reason}{about}"
    return f"circuit breaker {'open' if expect.breaker_open else 'closed'}"


def _describe_last_run(want: LastRunExpect) -> str:
    text = "request accepted" if want.accepted else "request refused"
    return text + (f" ({want.error_contains!r})" if want.error_contains else "")


def judge(expect: Expect, state: State, events: Sequence[dict[str, Any]]) -> Verdict:
    if expect.node is not None:
        return _node(expect, state)
    if expect.appwrapper is not None:
        return _appwrapper(expect, state)
    if expect.lending_limit is not None:
        return _lending(expect.lending_limit, state)
    if expect.event is not None:
        return _event(expect.event, events)
    open_now = bool(state["breaker_open"])
    return open_now == expect.breaker_open, f"breaker {'open' if open_now else 'closed'}"


def _node(expect: Expect, state: State) -> Verdict:
    node = state["nodes"].get(expect.node)
    if node is None:
        return False, f"no node {expect.node}"
    seen = f"verdict {node['verdict'] or NONE}, cordoned={node['cordoned']}, " \
           f"last-run {node['last_run']}"
    if expect.finding is not None:
        seen += f", findings {node['findings'] or NONE}"
    if expect.blamed_on is not None:
        seen += f", blamed on {node['blamed_on'] or NONE}"
    ok = (expect.verdict is None or node["verdict"] == expect.verdict.value) and \
        (expect.cordoned is None or node["cordoned"] == expect.cordoned) and \
        (expect.last_run is None or _last_run_matches(expect.last_run, node["last_run"])) and \
        (expect.finding is None or _has_finding(expect.finding, node["findings"])) and \
        (expect.blamed_on is None or node["blamed_on"] == sorted(expect.blamed_on))
    return ok, seen


def _has_finding(want: str, findings: Sequence[str]) -> bool:
    """`CODE` matches any entity; `CODE@entity` that entity only."""
    return any(f == want or f.partition("@")[0] == want for f in findings)


def _last_run_matches(want: LastRunExpect, got: dict[str, Any] | None) -> bool:
    if got is None or got.get("accepted") != want.accepted:
        return False
    if want.request is not None and got.get("request") != want.request:
        return False
    return want.error_contains is None or want.error_contains in str(got.get("error") or "")


def _appwrapper(expect: Expect, state: State) -> Verdict:
    aw = state["appwrappers"].get(expect.appwrapper)
    if aw is None:
        return False, f"no AppWrapper {expect.appwrapper}"
    seen = f"phase {aw['phase'] or NONE} on {aw['nodes']}"
    nodes = set(aw["nodes"])
    ok = (expect.phase is None or aw["phase"] == expect.phase) and \
        (expect.on_nodes is None or nodes == set(expect.on_nodes)) and \
        not nodes & set(expect.not_on or [])
    return ok, seen


def _lending(want: LendingExpect, state: State) -> Verdict:
    queue = state["lending"].get(want.queue)
    if queue is None:
        return False, f"no slack queue {want.queue}"
    entries = [(k, v) for k, v in queue.items()
               if k.endswith(f"/{want.resource}")
               and (want.flavor is None or k == f"{want.flavor}/{want.resource}")]
    if not entries:
        return False, f"{want.queue} has no {want.resource} for that flavor"
    _, found = entries[0]
    wanted = None if want.value is None else str(want.value)
    return found["limit"] == wanted, f"lendingLimit {found['limit'] or NONE} " \
                                     f"(nominal {found['nominal']})"


def _matching(want: EventExpect, events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first Event that `want` describes."""
    return next((event for event in events if event["reason"] == want.reason
                 and (want.object is None or event["object"] == want.object)
                 and (want.type is None or event["type"] == want.type)
                 and (want.message_contains is None
                      or want.message_contains in event["message"])), None)


def _event(want: EventExpect, events: Sequence[dict[str, Any]]) -> Verdict:
    event = _matching(want, events)
    if event is not None:
        return True, f"{event['type']} {event['reason']} on {event['object']}"
    recent = ", ".join(f"{e['reason']} on {e['object']}" for e in events[-5:]) or "no Events"
    return False, f"last Events: {recent}"


def held_since(expect: Expect, timeline: Sequence[dict[str, Any]],
               events: Sequence[dict[str, Any]]) -> float | None:
    """Since when `expect` has held, by what was recorded (`timeline` of observed
    states, `events`): an Event's posting, or the first of the latest run of states
    that satisfy it. A step that waits after an earlier one may find its expectation
    true already; this is when it came true. None when it does not hold."""
    if expect.event is not None:
        event = _matching(expect.event, events)
        return None if event is None else float(event["t"])
    since = None
    for entry in reversed(timeline):
        if not judge(expect, entry["state"], events)[0]:
            break
        since = float(entry["t"])
    return since
