"""The repair's pure half on the controller's side: what a node says to the decision,
the guarded write, the validation set and its verdict."""

from __future__ import annotations

import json
from typing import Any

import pytest

from healthd.config import Config
from healthd.controller.repair_state import (
    admin_cleared,
    finished,
    node_repair,
    repair_ops,
    started_reset,
    validating,
    validation_passed,
    validation_set,
)
from healthd.controller.reset_job import failed_gpus
from healthd.kube.conventions import Keys
from healthd.kube.shapes import Node, view
from healthd.published import Holding, LastRun, Repair
from healthd.repair.decision import Policy

KEYS = Keys()
HELD = Holding(code="REMAP_PENDING", check="remapped", entity="gpu3", severity="ERR",
               sticky=False, message="", since="2026-01-01T00:00:00Z", uuid="GPU-3")


def node(**annotations: str) -> Node:
    return view(Node, {"metadata": {"name": "n1", "resourceVersion": "7", "uid": "u1",
                                    "annotations": annotations, "labels": {}},
                       "spec": {}})


def last_run(checks: dict[str, str], *, accepted: bool = True, kind: str = "run",
             start: str = "2026-01-01T01:00:00Z") -> LastRun:
    return LastRun(id="repair-1", request=",".join(checks), kind=kind, accepted=accepted,
                   error="" if accepted else "refused", start=start, end=start,
                   duration_s=1.0, verdict="PASS", checks=checks)


def test_the_first_write_is_guarded_by_the_absence_later_ones_by_the_text() -> None:
    fresh = node_repair(node(), KEYS)
    new = started_reset(fresh.repair, job="ns/j", gpus=["GPU-3"], reason="r", now=0,
                        held=[HELD])
    ops = repair_ops(fresh, new, KEYS)
    assert ops[0] == {"op": "test", "path": "/metadata/annotations/healthd.io~1repair",
                      "value": None}
    assert json.loads(ops[1]["value"])["checks"] == ["remapped"]

    text = new.encode()
    ongoing = node_repair(node(**{KEYS.repair: text}), KEYS)
    ops = repair_ops(ongoing, validating(ongoing.repair, 1), KEYS, {KEYS.clear: "true"})
    assert ops[0] == {"op": "test", "path": "/metadata/annotations/healthd.io~1repair",
                      "value": text}
    assert ops[-1] == {"op": "add", "path": "/metadata/annotations/healthd.io~1clear",
                       "value": "true"}


def test_an_unreadable_repair_annotation_reads_as_idle_but_its_text_is_still_guarded() -> None:
    state = node_repair(node(**{KEYS.repair: "{not json"}), KEYS)
    assert state.state == "" and state.raw == "{not json"


def test_the_validation_set_is_the_raising_checks_then_the_enabled_extras() -> None:
    repair = Repair("resetting", "", checks=("remapped", "xid"))
    config = Config.model_validate({"checks": {"pciebw": {"enabled": False}}})
    assert validation_set(config, repair) == "remapped,xid,dcgm:2"
    assert validation_set(Config.model_validate({"checks": {"pciebw": {"enabled": False},
                                                            "dcgm": {"enabled": False}}}),
                          Repair("resetting", "")) == "all"


@pytest.mark.parametrize(("checks", "held", "passed"), [
    ({"remapped": "PASS", "pciebw": "SKIPPED", "dcgm:2": "WARN"}, (), True),
    ({"remapped": "ERR"}, (), False),
    ({"remapped": "UNKNOWN"}, (), False),
    ({"remapped": "PASS"}, (HELD,), False),
])
def test_a_validation_passes_only_when_nothing_fails_and_nothing_repaired_is_held(
        checks: dict[str, str], held: tuple[Holding, ...], passed: bool) -> None:
    why = validation_passed(last_run(checks), held, Policy())
    assert (why == "") == passed, why


def test_a_refused_validation_fails() -> None:
    assert "refused" in validation_passed(last_run({}, accepted=False), (), Policy())


def test_finishing_closes_the_open_attempt_and_keeps_the_history() -> None:
    repair = started_reset(Repair("", "", attempts=()), job="j", gpus=["GPU-3"], reason="r",
                           now=0, held=[HELD])
    done = finished(validating(repair, 1), "passed", "ok", 2)
    assert done.state == "" and [a.outcome for a in done.attempts] == ["passed"]
    assert done.run_id == "" and done.job == ""


def _inspected(last: LastRun | None) -> Any:
    doc = Repair("hardware-inspection", "2026-01-01T00:30:00Z").encode()
    extra = {KEYS.last_run: last.encode()} if last else {}
    return node_repair(node(**{KEYS.repair: doc, **extra}), KEYS)


def test_only_a_clear_answered_after_the_inspection_began_ends_it() -> None:
    assert admin_cleared(_inspected(last_run({}, kind="clear")))
    assert not admin_cleared(_inspected(last_run({}, kind="clear",
                                                 start="2026-01-01T00:10:00Z")))
    assert not admin_cleared(_inspected(last_run({}, kind="run")))
    assert not admin_cleared(_inspected(None))


def test_a_failed_reset_names_the_gpus_it_could_not_reset() -> None:
    message = json.dumps({"ok": False, "gpus": [
        {"uuid": "GPU-1", "ok": True, "exit_code": 0, "output": "reset"},
        {"uuid": "GPU-2", "ok": False, "exit_code": 1, "output": "GPU is lost"}]})
    assert failed_gpus(message) == "GPU-2: GPU is lost"
    assert failed_gpus("not json") == failed_gpus("[1]") == ""
