"""The agent shows the controller's repair: TESTING while it resets or validates the
GPUs (as during an exclusive diagnostic, held ERR and EVICT still win), PASS again when
it ends. An admin's clear while the repair holds the node (resetting, validating, a
reboot requested) is answered, refused, and changes nothing: the repair's own
validation (its clear written with the validation run) still releases what it is for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.published import Repair
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import load_machine_spec
from tests.agent.harness import KEYS, Harness, eventually, node_object, running_agent
from tests.agent.test_restarts import XID79_LINE

pytestmark = pytest.mark.anyio


def repair(state: str, *gpus: str, **fields: str) -> str:
    return Repair(state, "2026-01-01T00:00:00Z", gpus=gpus, **fields).encode()


# XID 79 on GPU 5 in the kernel log: sticky, EVICT until cleared
XID79 = load_machine_spec("healthy-8xh100").model_copy(update={"kernel_log": [XID79_LINE]})


def repair_shown(h: Harness) -> bool:
    """The node shows the repair: in `testing`, or in the condition's message."""
    doc = json.loads(h.annotations()[KEYS.health])
    return "repair" in doc.get("testing", []) or "; repair: " in (
        h.condition() or {}).get("message", "")


def held_codes(h: Harness) -> list[str]:
    return [item["code"] for item in json.loads(h.annotations()[KEYS.health])["held"]]


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


REPAIRS = [
    ("resetting", {"job": "healthd-system-repair/reset-1"}),
    ("validating", {"run_id": "repair-1"}),
    ("reboot-requested", {"request": "SelfNodeRemediation medik8s/gpu-node-1"}),
]


@pytest.mark.parametrize(("state", "fields"), REPAIRS, ids=[r[0] for r in REPAIRS])
async def test_an_admins_clear_while_a_repair_holds_the_node_is_answered_and_changes_nothing(
        api: ApiEmulator, tmp_path: Path, state: str, fields: dict[str, str]) -> None:
    async with running_agent(api, tmp_path, spec=XID79) as h:
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT")
        h.annotate(**{KEYS.repair: repair(state, "GPU-5", **fields)})
        await eventually(lambda: repair_shown(h), 5, "the repair shown")
        h.annotate(**{KEYS.clear: "true", KEYS.run_id: "admin-clear"})
        answer = await eventually(lambda: (a := h.last_run()) and a["id"] == "admin-clear"
                                  and a, 10, "the answer")
        assert answer["accepted"] is False
        assert f"the repair holds the node ({state}" in answer["error"]
        assert answer["verdict"] == "EVICT" and h.verdict() == "EVICT"
        assert held_codes(h) == ["XID_79"]
        assert await h.parts.publisher.flush(10)
        if state == "reboot-requested":
            message = (h.condition() or {}).get("message", "")
            assert message.endswith("; repair: reboot requested "
                                    "(SelfNodeRemediation medik8s/gpu-node-1)"), message
        assert [e for e in h.events("BadHealthRequest") if "admin-clear" in e["message"]]


async def test_the_repairs_own_validation_clears_what_it_is_for(
        api: ApiEmulator, tmp_path: Path) -> None:
    """The controller writes the validating record, its clear, the validation run and
    its run id in one write: the clear goes through, the run is answered under the id."""
    async with running_agent(api, tmp_path, spec=XID79) as h:
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT")
        h.annotate(**{KEYS.repair: repair("validating", run_id="repair-1"), KEYS.clear: "true",
                      KEYS.run: "xid", KEYS.run_id: "repair-1"})
        answer = await eventually(lambda: (a := h.last_run()) and a["id"] == "repair-1"
                                  and a, 10, "the validation's answer")
        assert (answer["kind"], answer["accepted"], answer["checks"]) == (
            "run", True, {"xid": "PASS"})
        assert held_codes(h) == []
        assert h.verdict() == "TESTING"  # until the controller closes the repair
        h.annotate(**{KEYS.repair: repair("")})
        await eventually(lambda: h.verdict() == "PASS", 5, "PASS once it is closed")
