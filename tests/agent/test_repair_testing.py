"""The agent shows the controller's repair: TESTING while it resets or validates the
GPUs (as during an exclusive diagnostic, held ERR and EVICT still win), PASS again when
it ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.published import Repair
from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, eventually, node_object, running_agent

pytestmark = pytest.mark.anyio


def repair(state: str, *gpus: str) -> str:
    return Repair(state, "2026-01-01T00:00:00Z", gpus=gpus).encode()


async def test_a_node_being_repaired_is_testing_and_says_what_the_repair_does(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", 10, "PASS")

        h.annotate(**{KEYS.repair: repair("resetting", "GPU-1", "GPU-2")})
        await eventually(lambda: h.verdict() == "TESTING", 5, "TESTING")
        assert await h.parts.publisher.flush(10)  # the condition goes out after the label
        condition = h.condition()
        assert condition is not None and condition["status"] == "False"
        assert condition["message"] == "GPU repair: resetting GPU-1, GPU-2"
        assert json.loads(h.annotations()[KEYS.health])["testing"] == ["repair"]

        h.annotate(**{KEYS.repair: repair("validating")})
        await eventually(lambda: (h.condition() or {}).get("message")
                         == "GPU repair: validating", 5, "validating")

        h.annotate(**{KEYS.repair: repair("")})
        await eventually(lambda: h.verdict() == "PASS", 5, "PASS again")
        assert "testing" not in json.loads(h.annotations()[KEYS.health])


async def test_a_held_err_finding_still_shows_while_the_repair_runs(
        api: ApiEmulator, tmp_path: Path) -> None:
    node = node_object()
    node["spec"] = {}
    api.seed(node)
    async with running_agent(api, tmp_path, spec="remap-pending", seed=False) as h:
        await eventually(lambda: h.verdict() == "ERR", 10, "ERR")
        h.annotate(**{KEYS.repair: repair("resetting", "GPU-3")})
        await eventually(lambda: json.loads(h.annotations()[KEYS.health]).get("testing")
                         == ["repair"], 5, "the repair seen")
        assert h.verdict() == "ERR"
