"""Reading what was written gives back what was meant, for any document (hypothesis):
`decode(encode(x)) == x` for the health annotation (with its ping view), the
last-run answer, the repair annotation and the clear in flight. And reading never
fails with an exception, whatever the annotation holds: anyone with node-patch rights
can write it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from healthd.published import (
    CheckStatus,
    Clearing,
    Health,
    Holding,
    LastRun,
    NetworkView,
    PingView,
    Repair,
    RepairAttempt,
    Seen,
    Undecodable,
)

text = st.text(max_size=20)
names = st.text(min_size=1, max_size=12)  # list entries: an empty one says nothing
counts = st.integers(min_value=-(2**63), max_value=2**63)

networks = st.builds(NetworkView, st.booleans(), st.lists(names, max_size=4).map(tuple))
pings = st.builds(PingView, networks, st.dictionaries(names, networks, max_size=3))
holdings = st.builds(Holding, text, text, text, text, st.booleans(), text, text, text,
                     st.booleans(), counts)
seen = st.builds(Seen, text, text, text, text, text)
healths = st.builds(
    Health, text, text, st.none() | text, st.lists(names, max_size=3).map(tuple),
    st.none() | pings, st.lists(holdings, max_size=4).map(tuple),
    st.lists(seen, max_size=3).map(tuple),
    st.dictionaries(text, st.builds(CheckStatus, text, text, text), max_size=4),
    st.none() | counts)
last_runs = st.builds(
    LastRun, text, text, text, st.booleans(), text, text, text,
    st.none() | st.floats(allow_nan=False, allow_infinity=False), text,
    st.dictionaries(text, text, max_size=4), st.dictionaries(text, text, max_size=4),
    st.none() | counts)

attempts = st.builds(RepairAttempt, text, text, st.lists(names, max_size=3).map(tuple), text)
repairs = st.builds(Repair, text, text, text, st.lists(names, max_size=3).map(tuple), text,
                    text, text, text, st.lists(attempts, max_size=4).map(tuple))

clearings = st.builds(Clearing, text, text, text)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20)
keys = st.sampled_from(["verdict", "since", "top", "testing", "ping", "held", "findings",
                        "checks", "truncated", "isolated", "unreached", "networks", "id",
                        "accepted", "duration_s", "reasons", "request_chars", "code", "flaps",
                        "state", "attempts", "gpus", "outcome", "remedy"])
# Objects shaped like the documents, with anything where a field should be.
shaped = st.recursive(
    json_values,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys | text, inner, max_size=6),
    max_leaves=30)


@given(healths)
def test_a_health_document_reads_back_as_written(doc: Health) -> None:
    assert Health.decode(doc.encode()) == doc


@given(last_runs)
def test_a_last_run_answer_reads_back_as_written(doc: LastRun) -> None:
    assert LastRun.decode(doc.encode()) == doc


@given(repairs)
def test_a_repair_document_reads_back_as_written(doc: Repair) -> None:
    assert Repair.decode(doc.encode()) == doc


@given(clearings)
def test_a_clear_in_flight_reads_back_as_written(doc: Clearing) -> None:
    assert Clearing.decode(doc.encode()) == doc


@given(healths)
def test_the_encoding_is_compact_ascii_json(doc: Health) -> None:
    encoded = doc.encode()
    assert encoded.isascii()
    assert encoded == json.dumps(json.loads(encoded), separators=(",", ":"))


@given(shaped)
def test_any_json_reads_as_a_document_or_says_why(value: Any) -> None:
    for model in (Health, LastRun, Repair, Clearing):
        decoded = model.decode(json.dumps(value))
        assert isinstance(decoded, model | Undecodable)
        if isinstance(decoded, Undecodable):
            assert not isinstance(value, dict) and decoded.why == "not a JSON object"
        else:  # what was read writes out again as a document of the same kind
            assert isinstance(model.decode(decoded.encode()), model)


@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_text_reads_as_a_document_or_says_why(raw: str | bytes) -> None:
    assert isinstance(Health.decode(raw), Health | Undecodable)
    assert isinstance(LastRun.decode(raw), LastRun | Undecodable)
    assert isinstance(Repair.decode(raw), Repair | Undecodable)
    assert isinstance(Clearing.decode(raw), Clearing | Undecodable)
