"""Writes the API server refuses as too large never hold back the label: an
on-demand request of 200,000 characters is answered with a bounded echo that says
it was cut, and a Node whose other owners' annotations leave no room for healthd's
gets its label and condition anyway, the refused patch never sent again as it was.
The API emulator enforces the real server's limit (all annotations of an object
together at most 256 KiB; 422 "Too long: may not be more than 262144 bytes")."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, NODE, Harness, eventually, node_object, running_agent

pytestmark = pytest.mark.anyio

LIMIT = 262_144
REQUEST = '"' * 200_000  # fits on the Node; JSON-escaped, twice that


def refused(h: Harness) -> list:
    return [r for r in h.node_writes() if r.status == 422]


def resent(h: Harness) -> list[tuple[str, int]]:
    """Refused bodies that went out more than once."""
    bodies = Counter(json.dumps(r.body, sort_keys=True) for r in refused(h))
    return [(body[:80], n) for body, n in bodies.items() if n > 1]


async def test_a_200000_character_request_is_answered_in_brief_and_an_xid_still_evicts(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        h.request(REQUEST, run_id="huge")
        answer = await eventually(lambda: (a := h.last_run()) and a["id"] == "huge" and a, 10,
                                  "the answer")
        assert answer["accepted"] is False and answer["request_chars"] == 200_000
        assert len(answer["request"]) <= 256
        assert len(h.annotations()[KEYS.last_run]) < 4096
        h.sim.nvml.emit_xid(3, 79)
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT after an XID 79")
        assert refused(h) == []


async def test_a_node_with_no_room_left_for_annotations_still_gets_its_label(
        api: ApiEmulator, tmp_path: Path) -> None:
    node = node_object()
    filler_key = "team.example.com/inventory"
    node["metadata"]["annotations"] = {filler_key: "x" * (LIMIT - len(filler_key) - 64)}
    api.seed(node)
    async with running_agent(api, tmp_path, seed=False) as h:
        await eventually(lambda: h.verdict() == "PASS", 10, "the first verdict")
        h.sim.nvml.emit_xid(3, 79)
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT after an XID 79")
        await eventually(lambda: (h.condition() or {}).get("status") == "True", 10,
                         "the condition")
        assert refused(h)  # the annotations really did not fit
        assert KEYS.health not in h.annotations()
        assert resent(h) == []  # never the same refused patch twice
        assert h.annotations()[filler_key] == node["metadata"]["annotations"][filler_key]
    assert api.get("Node", NODE) is not None
