"""The reboot-repair story end to end: XID 79 under a running AppWrapper is repaired
through a reboot healthd asks for and never does (EVICT, the job reset and moved,
one reboot request, the node's new boot id, the request deleted, validation, PASS,
the lending limit back), in that order, with no admin step."""

from __future__ import annotations

from typing import Any

from tests.demo.playing import played

STORY = "reboot-repair"
NODE = "gpu-node-1"
CAUSAL = [("fault", "evict"), ("evict", "job-reset"), ("evict", "work-gone"),
          ("work-gone", "reboot-requested"), ("reboot-requested", "rebooted"),
          ("rebooted", "pass"), ("pass", "lending-back")]


def events(result: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    return [e for e in result["events"] if e["reason"] == reason and e["object"] == NODE]


def test_xid_79_is_repaired_by_a_reboot_request_with_no_admin_step() -> None:
    code, result = played(STORY)
    assert (code, result["failure"]) == (0, None)
    marks = result["marks"]
    for before, after in CAUSAL:
        assert marks[before] <= marks[after], (before, after)
    for reason in ("RebootRequested", "RebootDone", "RepairSucceeded"):
        assert len(events(result, reason)) == 1, reason
    assert not events(result, "RepairFailed") and not events(result, "RebootTimedOut")
    assert result["timings"]["fault_to_pass"] > 0
