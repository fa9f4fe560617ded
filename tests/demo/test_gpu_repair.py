"""The gpu-repair story end to end: XID 95 (a fault a GPU reset clears) under a
running AppWrapper is repaired with no admin step (EVICT, the job reset and moved,
the slack queue's lendingLimit down, the GPU-reset Job's own `healthd gpu-reset` run
on the node's machine, validation, PASS, the limit back), in that order and timed;
and the story fails where the chain breaks: with repairs off, at the reset; with a
fault the reset cannot clear, at validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from healthd.sim.machine import load_machine_spec
from tests.demo.playing import bundled_raw, play_variant, played

STORY = "gpu-repair"
NODE = "gpu-node-1"
LENDING = ("slack-cluster-queue", "default-flavor/nvidia.com/gpu")
# The chain's marks, each pair (before, after) in causal order: the second happens
# only once the first has (marks that race, as the operator taking the pods away and
# the controller's Event about the reset, are not compared).
CAUSAL = [("fault", "evict"), ("evict", "job-reset"), ("evict", "lending-shrunk"),
          ("evict", "work-gone"), ("work-gone", "reset-job"), ("reset-job", "reset-done"),
          ("reset-job", "testing"), ("reset-done", "pass"), ("testing", "pass"),
          ("pass", "lending-back")]


def events(result: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    return [e for e in result["events"] if e["reason"] == reason and e["object"] == NODE]


def final(result: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = result["timeline"][-1]["state"]
    return state


def limits(result: dict[str, Any]) -> list[str | None]:
    queue, resource = LENDING
    return [e["state"]["lending"][queue][resource]["limit"] for e in result["timeline"]
            if e["t"] >= 0]


def step_index(raw: dict[str, Any], mark: str) -> int:
    return next(i for i, step in enumerate(raw["steps"]) if step.get("mark") == mark)


def test_the_gpu_is_reset_and_the_node_returns_with_no_admin_step() -> None:
    code, result = played(STORY)
    assert (code, result["failure"]) == (0, None)
    # Nobody acted but healthd: the story's only action is the fault itself.
    assert [s["action"] for s in result["steps"] if s["action"] != "wait_for"] == ["fault"]
    marks = result["marks"]
    assert [(a, b) for a, b in CAUSAL if marks[a] > marks[b]] == []
    assert result["timings"] == {"fault_to_pass": round(marks["pass"] - marks["fault"], 2)}
    assert result["timings"]["fault_to_pass"] > 0

    uuid = load_machine_spec("healthy-8xh100").model_copy(update={"node": NODE}).uuid(3)
    resets = events(result, "GPUReset")
    assert len(resets) == 1 and uuid in resets[0]["message"]
    assert "healthd-system-repair/healthd-gpu-reset-gpu-node-1-1" in resets[0]["message"]
    for reason in ("RepairValidating", "RepairSucceeded"):
        assert len(events(result, reason)) == 1, reason
    assert events(result, "RepairFailed") == []
    # The driver asked for a reset, and no longer does: with no repair step in the
    # story, only the Job's reset on the node's machine could have done that.
    findings = [e["state"]["nodes"][NODE]["findings"] for e in result["timeline"]]
    assert any(f.startswith("RECOVERY_GPU_RESET@") for seen in findings for f in seen)
    assert findings[-1] == []

    assert final(result)["nodes"][NODE]["verdict"] == "PASS"
    assert final(result)["appwrappers"]["blue/train"] == {"phase": "Running",
                                                           "nodes": ["gpu-node-2"]}
    assert "0" in limits(result) and limits(result)[-1] is None


def test_with_repairs_off_the_story_fails_where_the_reset_should_come(tmp_path: Path) -> None:
    raw = bundled_raw(STORY)
    raw["config"]["controller"]["repair"]["enabled"] = False
    index = step_index(raw, "reset-job")
    raw["steps"][index]["wait_for"]["timeout"] = 3

    code, result = play_variant(raw, tmp_path)
    assert (code, result["passed"]) == (1, False)
    assert result["failure"].startswith(
        f"step {index} (wait_for): expected an Event GPUReset on {NODE} within 3 s")
    assert final(result)["nodes"][NODE]["verdict"] == "EVICT"
    assert limits(result)[-1] == "0"
    assert events(result, "GPUReset") == [] and "pass" not in result["marks"]
    assert result["timings"] == {}


def test_a_fault_the_reset_cannot_clear_fails_validation(tmp_path: Path) -> None:
    raw = bundled_raw(STORY)
    fault = step_index(raw, "fault")
    raw["steps"][fault]["fault"]["hardware"] = True  # survives resets: a broken GPU
    done = step_index(raw, "reset-done")
    raw["steps"][done + 1:] = [
        {"wait_for": {"event": {"reason": "RepairFailed", "object": NODE}, "timeout": 20}},
        {"wait_for": {"node": NODE, "verdict": "PASS", "timeout": 3}}]
    raw["timings"] = {}  # its `pass` mark is gone with the steps

    code, result = play_variant(raw, tmp_path)
    assert (code, result["passed"]) == (1, False)
    assert result["failure"].startswith(
        f"step {done + 2} (wait_for): expected node {NODE} verdict PASS within 3 s")
    # The Job ran and its reset succeeded, but the driver still asks for one: the
    # recovery check fails the validation (when it was in the validation set) or its
    # finding is still held after it.
    assert events(result, "RepairValidating")
    failed = events(result, "RepairFailed")
    assert failed and ("recovery ERR" in failed[0]["message"]
                       or "RECOVERY_GPU_RESET" in failed[0]["message"]), failed
    assert final(result)["nodes"][NODE]["verdict"] != "PASS"
