"""Reading a published document that someone else wrote: garbage is a value saying
why (never an exception), and inside a document one odd field or item reads as
absent without hiding the rest."""

from __future__ import annotations

import json
from typing import Any

from healthd.kube.conventions import Keys
from healthd.published import (
    Health,
    LastRun,
    NetworkView,
    PingView,
    Undecodable,
    read_health,
    read_last_run,
)

KEYS = Keys()
NESTED = "[" * 100_000 + "]" * 100_000  # valid JSON, far deeper than Python's decoder recurses


def node(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "annotations": annotations}}


def why(decoded: object) -> str:
    assert isinstance(decoded, Undecodable)
    return decoded.why


def test_garbage_is_undecodable_and_says_why() -> None:
    assert why(Health.decode(NESTED)) == "nested deeper than 32 levels"
    assert why(Health.decode("{not json")).startswith("not JSON")
    assert why(LastRun.decode('["a list"]')) == "not a JSON object"
    too_big = json.dumps({"verdict": "x" * 300_000})
    assert "more than the 262144 allowed" in why(Health.decode(too_big))


def test_reading_from_a_node() -> None:
    assert read_health(node(), KEYS) is None
    assert read_health(node(**{KEYS.health: "{}"}), KEYS) is None  # says nothing
    assert read_health(node(**{KEYS.health: NESTED}), KEYS) == Undecodable(
        "nested deeper than 32 levels")
    assert read_health({"metadata": {"annotations": {KEYS.health: 7}}}, KEYS) == Undecodable(
        "not a string")
    doc = read_health(node(**{KEYS.health: '{"verdict":"WARN","since":"t"}'}), KEYS)
    assert isinstance(doc, Health) and (doc.verdict, doc.since, doc.held) == ("WARN", "t", ())
    run = read_last_run(node(**{KEYS.last_run: '{"id":"r1","accepted":true}'}), KEYS)
    assert isinstance(run, LastRun) and (run.id, run.accepted, run.duration_s) == (
        "r1", True, None)


def test_an_odd_field_reads_as_absent_and_hides_nothing_else() -> None:
    doc = Health.decode(json.dumps({
        "verdict": "EVICT", "since": 5, "top": ["XID_79"], "testing": "dcgm:3",
        "held": [{"code": "XID_79", "severity": "EVICT", "flaps": "many", "sticky": "yes"},
                 "junk", 3, {"code": "REMAP_FAILURE", "flaps": 2}],
        "findings": {"not": "a list"},
        "checks": {"a": "PASS", "b": {"status": "PASS", "at": "t", "reason": None}},
        "truncated": True}))
    assert isinstance(doc, Health)
    assert (doc.verdict, doc.since, doc.top, doc.testing) == ("EVICT", "", None, ())
    assert [(h.code, h.severity, h.flaps, h.sticky) for h in doc.held] == [
        ("XID_79", "EVICT", 0, False), ("REMAP_FAILURE", "", 2, False)]
    assert doc.findings == () and doc.truncated is None
    assert list(doc.checks) == ["b"] and doc.checks["b"].reason == ""


def test_the_ping_view_keeps_what_is_readable() -> None:
    def ping(view: object) -> PingView | None:
        doc = Health.decode(json.dumps({"verdict": "PASS", "ping": view}))
        assert isinstance(doc, Health)
        return doc.ping

    view = ping({"isolated": False, "unreached": ["n2", 3, "", "n4"],
                 "networks": {"net1": {"isolated": "yes"}, "net2": {"unreached": ["n5"]},
                              "net3": {"isolated": True, "unreached": "all"}, "net4": []}})
    assert view is not None and view.pod == NetworkView(False, ("n2", "n4"))
    assert dict(view.networks) == {"net2": NetworkView(False, ("n5",)),
                                   "net3": NetworkView(True, ())}
    # The pod network's row is the view: without a readable one there is none.
    assert ping({"isolated": "no", "networks": {"net1": {"isolated": True}}}) is None
    assert ping({"unreached": "n2"}) is None
    assert ping(["n2"]) is None
