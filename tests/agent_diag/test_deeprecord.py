"""The run record a diagnostic Job carries (`healthd.io/diagnostic-run`): what the
next agent needs to finish the run survives the trip through the annotation, and a
record anyone garbled is read as far as it can be, never into a pass."""

from __future__ import annotations

import json

from checks.base import CheckResult, Severity
from healthd.agent.deeprecord import NOT_RUN_AFTER_RESTART, Asked, DeepRecord, read_record
from healthd.agent.verdict import Trigger
from healthd.kube.conventions import Keys
from healthd.published import Undecodable
from healthd.requests import Request

KEYS = Keys()
TAKEN_AT = 1_747_166_095.25


def job_with(text: str) -> dict[str, object]:
    return {"metadata": {"annotations": {KEYS.diagnostic_run: text}}}


def test_a_record_brings_back_the_request_its_start_and_what_ran_before() -> None:
    asked = Asked(Request("deep-7", "remapped,dcgm:3,dcgm:4", "run"), TAKEN_AT)
    done = {"remapped": CheckResult("remapped", Severity.WARN),
            "pcie": CheckResult.unknown("pcie", "no driver"), "pciebw": "GPUs are busy"}
    record = DeepRecord.of("dcgm:3", Trigger.ON_DEMAND, asked=asked, at=0.0, done=done,
                           rest=("dcgm:4",))
    back = read_record(job_with(record.encode()), KEYS)
    assert isinstance(back, DeepRecord)
    assert back.request == Request("deep-7", "remapped,dcgm:3,dcgm:4", "run")
    assert (back.run_trigger, back.started(0.0)) == (Trigger.ON_DEMAND, TAKEN_AT)
    results = back.results(CheckResult("dcgm", Severity.EVICT))
    assert {k: v.status if isinstance(v, CheckResult) else v for k, v in results.items()} == {
        "remapped": Severity.WARN, "pcie": Severity.UNKNOWN, "pciebw": "GPUs are busy",
        "dcgm:3": Severity.EVICT, "dcgm:4": NOT_RUN_AFTER_RESTART}
    assert isinstance(results["pcie"], CheckResult) and results["pcie"].reason == "no driver"


def test_a_scheduled_run_has_no_request_to_answer() -> None:
    record = DeepRecord.of("dcgm:3", Trigger.PERIODIC, asked=None, at=TAKEN_AT)
    back = DeepRecord.decode(record.encode())
    assert isinstance(back, DeepRecord) and back.request is None
    assert back.started(0.0) == TAKEN_AT


def test_garbage_is_undecodable_and_odd_fields_read_as_nothing() -> None:
    assert isinstance(read_record(job_with("{not json"), KEYS), Undecodable)
    assert read_record({"metadata": {}}, KEYS) is None
    odd = {"key": "dcgm:3", "trigger": "cosmic-ray", "start": "yesterday",
           "request": {"id": "", "kind": "run"},
           "done": {"remapped": {"status": "GREAT"}, "pcie": {"status": "PASS"},
                    "ecc": ["PASS"], "xid": {"not_run": "busy"}},
           "rest": ["dcgm:4", 7, ""]}
    back = read_record(job_with(json.dumps(odd)), KEYS)
    assert isinstance(back, DeepRecord)
    assert back.run_trigger is Trigger.PERIODIC and back.started(42.0) == 42.0
    assert back.request is None  # no id: nothing to answer
    assert set(back.done) == {"pcie", "xid"} and back.rest == ("dcgm:4",)
