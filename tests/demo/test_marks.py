"""A scenario's marks and timings, from what was recorded: an expectation's moment is
since when it has held (the first of the latest run of states that satisfy it, or the
Event's posting), not when the player got round to it; a timing is the seconds
between two marks, once both were reached; the summary shows both."""

from __future__ import annotations

from typing import Any

from healthd.demo.expect import held_since
from healthd.demo.scenario import Expect, measure
from healthd.demo.view import summary


def state(verdict: str) -> dict[str, Any]:
    node = {"verdict": verdict, "condition": None, "cordoned": False, "last_run": None,
            "findings": [], "blamed_on": []}
    return {"nodes": {"n1": node}, "appwrappers": {}, "lending": {}, "breaker_open": False}


TIMELINE = [{"t": -1.0, "state": state("PASS")}, {"t": 1.0, "state": state("EVICT")},
            {"t": 2.0, "state": state("PASS")}, {"t": 3.5, "state": state("PASS")}]
EVENTS = [{"t": 0.5, "type": "Normal", "reason": "Other", "object": "n1", "message": ""},
          {"t": 1.2, "type": "Normal", "reason": "GPUReset", "object": "n1", "message": "x"},
          {"t": 2.2, "type": "Normal", "reason": "GPUReset", "object": "n1", "message": "y"}]


def test_a_state_held_since_the_start_of_its_latest_run() -> None:
    assert held_since(Expect(node="n1", verdict="PASS"), TIMELINE, EVENTS) == 2.0
    assert held_since(Expect(node="n1", verdict="EVICT"), TIMELINE, EVENTS) is None


def test_an_event_held_since_the_first_one_that_matches() -> None:
    assert held_since(Expect(event={"reason": "GPUReset"}), TIMELINE, EVENTS) == 1.2
    assert held_since(Expect(event={"reason": "GPUReset", "message_contains": "y"}),
                      TIMELINE, EVENTS) == 2.2
    assert held_since(Expect(event={"reason": "Never"}), TIMELINE, EVENTS) is None


def test_timings_between_marks_reached() -> None:
    timings = {"fault_to_pass": ("fault", "pass"), "fault_to_evict": ("fault", "evict")}
    assert measure(timings, {"fault": 1.0, "evict": 1.25}) == {"fault_to_evict": 0.25}
    assert measure(timings, {"fault": 1.0, "evict": 1.25, "pass": 6.5}) == {
        "fault_to_evict": 0.25, "fault_to_pass": 5.5}


def test_the_summary_shows_the_timings_and_the_marks_in_the_order_they_happened() -> None:
    result = {"scenario": "s", "passed": True, "failure": None, "steps_done": [0, 1, 2],
              "step_count": 3, "duration_s": 7.0, "timeline": [],
              "marks": {"fault": 1.0, "moved": 3.0, "reset": 1.5, "pass": 5.5},
              "timings": {"fault_to_pass": 4.5}}
    lines = summary(result).splitlines()
    assert "timing fault_to_pass: 4.50 s" in lines
    table = lines[lines.index("timing fault_to_pass: 4.50 s") + 1:]
    assert table[0].split() == ["MARK", "AT", "(s)", "SINCE", "FIRST", "SINCE", "PREVIOUS"]
    assert [row.split() for row in table[1:]] == [
        ["fault", "1.00", "+0.00", "+0.00"], ["reset", "1.50", "+0.50", "+0.50"],
        ["moved", "3.00", "+2.00", "+1.50"], ["pass", "5.50", "+4.50", "+2.50"]]
    assert "MARK" not in summary({**result, "marks": {}, "timings": {}})
