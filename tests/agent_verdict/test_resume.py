"""What a restarted agent resumes from its Node (healthd.agent.resume, verdict.resume):
holdings as they were published, nothing it cannot trust, and never a PASS where the
label said ERR or EVICT."""

from __future__ import annotations

import json
from typing import Any

from checks.base import Severity
from healthd.agent.resume import RESUMED_CODE, resumed_from
from healthd.agent.verdict import RESUMED, Policy, Trigger, apply, initial, request_clear, resume
from healthd.kube.conventions import Keys, Verdict
from tests.agent_verdict.results import clean, run_of

KEYS = Keys()
NOW = 1_800_000_000.0
KNOWN = {"xid", "remapped", "rdma", "power"}


def _holding(**fields: Any) -> dict[str, Any]:
    return {"code": "XID_79", "check": "xid", "entity": "gpu5", "severity": "EVICT",
            "sticky": True, "message": "GPU has fallen off the bus",
            "since": "2026-11-20T10:00:00Z", **fields}


def _node(label: str | None, doc: Any) -> dict[str, Any]:
    annotations = {} if doc is None else {
        KEYS.health: doc if isinstance(doc, str) else json.dumps(doc)}
    labels = {} if label is None else {KEYS.gpuhealth: label}
    return {"metadata": {"name": "n1", "labels": labels, "annotations": annotations}}


def _resumed(label: str | None, doc: Any) -> Any:
    return resumed_from(_node(label, doc), KEYS, known=KNOWN.__contains__, at=NOW)


def test_published_holdings_come_back_as_they_were() -> None:
    doc = {"verdict": "EVICT", "since": "2026-11-20T10:00:00Z",
           "held": [_holding(), _holding(code="RDMA_PORT_DOWN", check="rdma", entity="mlx5_4/1",
                                         severity="ERR", sticky=False, flaps=2,
                                         clear_requested=True)],
           "checks": {"xid": {"status": "EVICT", "at": "2026-11-20T10:00:00Z"},
                      "rdma": {"status": "UNKNOWN", "at": "2026-11-20T10:00:00Z",
                               "reason": "sysfs unreadable"}}}
    taken = _resumed("EVICT", doc)
    assert taken.notes == ()
    assert [(h.code, h.severity, h.sticky, h.flaps, h.clear_requested) for h in taken.held] == [
        ("XID_79", Severity.EVICT, True, 0, False),
        ("RDMA_PORT_DOWN", Severity.ERR, False, 2, True)]
    assert taken.held[0].since < NOW
    assert taken.checks["rdma"].status is Severity.UNKNOWN
    state = resume(initial(NOW), taken.held, taken.checks, shown=taken.shown,
                   since=taken.since, at=NOW)
    assert state.verdict is Verdict.EVICT and state.judged
    assert state.since == taken.since  # the verdict did not change: nor does its time


def test_what_cannot_be_trusted_is_not_resumed_and_says_why() -> None:
    doc = {"verdict": "ERR", "since": "x",
           "held": [_holding(severity="BOGUS"), _holding(check="gone"),
                    _holding(severity="PASS"), _holding(code=""),
                    _holding(code="REMAP_PENDING", check="remapped", severity="ERR",
                             sticky=False, since="not a time")]}
    taken = _resumed("ERR", doc)
    assert [h.code for h in taken.held] == ["REMAP_PENDING"]
    assert taken.held[0].since == NOW
    assert len(taken.notes) == 4
    assert any("'gone'" in note for note in taken.notes)


def test_an_unhealthy_label_nothing_explains_is_held_until_a_clear() -> None:
    for doc in (None, "{garbage", {"verdict": "PASS", "since": "", "held": []}):
        taken = _resumed("EVICT", doc)
        assert [(h.code, h.check, h.severity, h.sticky) for h in taken.held] == [
            (RESUMED_CODE, RESUMED, Severity.EVICT, True)]
        state = resume(initial(NOW), taken.held, taken.checks, shown=taken.shown,
                       since=taken.since, at=NOW)
        assert state.verdict is Verdict.EVICT
        cleared, rerun = request_clear(state, at=NOW + 1)
        assert cleared.verdict is Verdict.PASS and rerun == frozenset()
    assert _resumed("ERR", None).held[0].severity is Severity.ERR
    assert _resumed("WARN", None).held == ()  # a WARN label holds nothing back
    assert _resumed("EVICT", {"verdict": "EVICT", "held": [_holding()]}).held[0].code == "XID_79"


def test_resumed_holdings_merge_with_what_this_process_already_found() -> None:
    policy = Policy()
    state = apply(initial(NOW), "remapped", run_of("remapped", ("REMAP_PENDING", 2)),
                  trigger=Trigger.PERIODIC, at=NOW, policy=policy)
    taken = _resumed("EVICT", {"verdict": "EVICT", "held": [_holding()]})
    state = resume(state, taken.held, taken.checks, shown=taken.shown, since=None, at=NOW)
    assert [h.code for h in state.held] == ["XID_79", "REMAP_PENDING"]
    # A clean xid run does not release the sticky holding; its flaps carry on.
    state = apply(state, "xid", clean("xid"), trigger=Trigger.PERIODIC, at=NOW + 1,
                  policy=policy)
    assert state.verdict is Verdict.EVICT


def test_a_resumed_damped_holding_keeps_its_flaps() -> None:
    policy = Policy(recover_after=2, min_hold=0)
    doc = {"verdict": "ERR", "held": [_holding(code="RDMA_PORT_DOWN", check="rdma",
                                               entity="mlx5_4/1", severity="ERR",
                                               sticky=False, flaps=1)]}
    taken = _resumed("ERR", doc)
    state = resume(initial(NOW), taken.held, taken.checks, shown=taken.shown, since=None,
                   at=NOW)
    runs = 0
    while state.verdict is Verdict.ERR:
        runs += 1
        state = apply(state, "rdma", clean("rdma"), trigger=Trigger.PERIODIC,
                      at=NOW + runs, policy=policy)
    assert runs == policy.hold_runs(1)  # 2 x 4: the flap still lengthens the hold


def test_a_restart_publishes_the_same_ping_view() -> None:
    """The peers the ping view names come back with it, so a restarted agent's first
    write does not turn "reached n2, n3" into "probed nobody" (and blame keeps them)."""
    from checks.base import Entity, ResultBuilder
    from checks.catalog import Catalog
    from healthd.agent.node_view import health_json

    builder = ResultBuilder("ping", Catalog())
    for peer in ("n2", "n3"):
        builder.seen(Entity.peer(peer))
    builder.finding("PEER_UNREACHABLE", Entity.peer("n4"), "n4 does not answer")
    builder.seen(Entity.peer("n2", "net1"))
    state = initial(NOW)
    for at in (NOW, NOW + 300):
        state = apply(state, "ping", builder.build(), trigger=Trigger.PERIODIC, at=at,
                      policy=Policy())
    published = json.loads(health_json(state))
    taken = resumed_from(_node(state.verdict.value, published), KEYS,
                         known={"ping"}.__contains__, at=NOW + 400)
    again = resume(initial(NOW + 400), taken.held, taken.checks, shown=taken.shown,
                   since=taken.since, at=NOW + 400)
    assert published["ping"]["reached"] == ["n2", "n3"]
    assert json.loads(health_json(again))["ping"]["reached"] == ["n2", "n3"]
