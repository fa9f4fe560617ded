"""The published documents are an interface: what the agent writes for a state (the
`health` annotation) and for a request (`last-run`) is byte for byte what earlier
releases wrote (`golden.json` holds their output for the states in `states.py`), and
reading a document back and writing it again gives the same bytes, so the publisher's
"write only on change" comparison never sees a difference that is not there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.agent.node_view import HEALTH_LIMIT, health_json
from healthd.published import Health, LastRun
from tests.published.states import answers, states

GOLDEN = json.loads((Path(__file__).parent / "golden.json").read_text())


@pytest.mark.parametrize("name", sorted(states()))
def test_the_health_annotation_is_what_earlier_releases_wrote(name: str) -> None:
    state, limit = states()[name]
    assert health_json(state, limit or HEALTH_LIMIT) == GOLDEN["health"][name]


@pytest.mark.parametrize("name", sorted(answers()))
def test_the_last_run_answer_is_what_earlier_releases_wrote(name: str) -> None:
    assert answers()[name] == GOLDEN["last_run"][name]


@pytest.mark.parametrize("name", sorted(GOLDEN["health"]))
def test_a_health_document_reads_back_to_the_same_bytes(name: str) -> None:
    text = GOLDEN["health"][name]
    doc = Health.decode(text)
    assert isinstance(doc, Health)
    assert doc.encode() == text


@pytest.mark.parametrize("name", sorted(GOLDEN["last_run"]))
def test_a_last_run_answer_reads_back_to_the_same_bytes(name: str) -> None:
    text = GOLDEN["last_run"][name]
    doc = LastRun.decode(text)
    assert isinstance(doc, LastRun)
    assert doc.encode() == text
