"""The `recovery` check end to end: a machine spec's `recovery_action`, served by the
fake NVML's nvmlDeviceGetFieldValues under the real pynvml, read in the one NVML
pass and judged by `healthd check --sim`:

- every action the driver can name gives its code with its severity on its GPU, and
  the action is on the GPU's row; NONE is PASS; a number newer than the names WARN;
- a driver that does not report the field (NOT_SUPPORTED in the field's own return,
  or for the whole call) is SKIPPED for that GPU with the reason, never UNKNOWN;
- a recording of a machine whose driver asks for an action replays to the same
  finding; the action ends with the fault (after the reset)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from healthd.cli import main

# action -> (code, severity, sticky); None: no finding
ACTIONS: dict[str | int, tuple[str, str, bool] | None] = {
    "NONE": None,
    "GPU_RESET": ("RECOVERY_GPU_RESET", "ERR", False),
    "BUS_RESET": ("RECOVERY_BUS_RESET", "ERR", False),
    "DRAIN_P2P": ("RECOVERY_DRAIN_P2P", "EVICT", False),
    "DRAIN_AND_RESET": ("RECOVERY_DRAIN_AND_RESET", "EVICT", True),
    "NODE_REBOOT": ("RECOVERY_NODE_REBOOT", "EVICT", True),
    "SYSTEM_REBOOT": ("RECOVERY_SYSTEM_REBOOT", "EVICT", True),
    "RECOVER_IMEX_DOMAIN": ("RECOVERY_IMEX_DOMAIN", "ERR", False),
    12: ("RECOVERY_UNKNOWN_ACTION", "WARN", False),
}


def write_spec(tmp_path: Path, spec: dict[str, Any], name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def recovery_report(capsys: pytest.CaptureFixture[str], spec: str) -> dict[str, Any]:
    main(["check", "--sim", spec, "--checks", "recovery", "--output", "json"])
    (report,) = json.loads(capsys.readouterr().out)["checks"]
    return dict(report)


def rows(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {row["entity"]["index"]: row for row in report["entities"]}


@pytest.mark.parametrize("action", list(ACTIONS), ids=str)
def test_each_action_gives_its_code_and_severity_on_its_gpu(
        action: str | int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, {"gpus": {"count": 4},
                                 "faults": [{"gpu": 2, "recovery_action": action}]})
    report = recovery_report(capsys, spec)
    by_gpu = rows(report)
    name = action if isinstance(action, str) else f"UNKNOWN_{action}"
    code = action if isinstance(action, int) else None
    assert by_gpu[2]["values"]["recovery_action"] == name
    assert code is None or by_gpu[2]["values"]["recovery_action_code"] == code
    assert all(by_gpu[i]["status"] == "PASS" for i in (0, 1, 3))
    assert all(by_gpu[i]["values"]["recovery_action"] == "NONE" for i in (0, 1, 3))
    expected = ACTIONS[action]
    if expected is None:
        assert (report["status"], report["findings"]) == ("PASS", [])
        return
    (finding,) = report["findings"]
    assert (finding["code"], finding["severity"], finding["sticky"]) == expected
    assert finding["entity"]["index"] == 2 and by_gpu[2]["status"] == expected[1]


def test_an_unknown_action_names_its_number(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, {"gpus": {"count": 1},
                                 "faults": [{"gpu": 0, "recovery_action": 12}]})
    (finding,) = recovery_report(capsys, spec)["findings"]
    assert "recovery action 12" in finding["message"]


@pytest.mark.parametrize("gpus", [
    {"count": 2, "field_errors": {230: "NOT_SUPPORTED"}},  # the field's own answer
    {"count": 2, "unsupported": ["nvmlDeviceGetFieldValues"]},  # the whole call
], ids=["field", "call"])
def test_a_driver_without_the_field_is_skipped_never_unknown(
        gpus: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = recovery_report(capsys, write_spec(tmp_path, {"gpus": gpus}))
    assert report["status"] == "SKIPPED" and report["findings"] == []
    for row in rows(report).values():
        assert row["status"] == "SKIPPED"
        assert row["reason"] == ("GPU recovery action: not reported by this driver "
                                 "(field 230: NOT_SUPPORTED)")


def test_one_gpu_refusing_the_field_leaves_the_others_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, {"gpus": {"count": 3}, "faults": [
        {"gpu": 0, "field_errors": {230: "UNKNOWN"}},
        {"gpu": 1, "recovery_action": "GPU_RESET"}]})
    report = recovery_report(capsys, spec)
    by_gpu = rows(report)
    assert by_gpu[0]["status"] == "SKIPPED" and "field 230: UNKNOWN" in by_gpu[0]["reason"]
    assert (by_gpu[1]["status"], by_gpu[2]["status"]) == ("ERR", "PASS")
    assert report["status"] == "ERR"


def test_the_action_ends_with_the_fault(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A fault that ended (the GPU was reset) reads NONE again."""
    spec = write_spec(tmp_path, {"gpus": {"count": 1}, "faults": [
        {"gpu": 0, "at": 0, "until": 0.001, "recovery_action": "GPU_RESET"}]})
    report = recovery_report(capsys, spec)
    assert (report["status"], rows(report)[0]["values"]["recovery_action"]) == ("PASS", "NONE")


def test_a_recorded_action_replays_to_the_same_finding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, {"gpus": {"count": 3, "field_errors": {}}, "faults": [
        {"gpu": 0, "recovery_action": "NODE_REBOOT"},
        {"gpu": 1, "recovery_action": 12},
        {"gpu": 2, "field_errors": {230: "NOT_SUPPORTED"}}]})
    recording = tmp_path / "recorded.yaml"
    assert main(["record", "--sim", spec, "--output", str(recording)]) == 0
    capsys.readouterr()
    recorded = {entry["gpu"]: entry for entry in yaml.safe_load(recording.read_text())["faults"]}
    assert recorded[0]["recovery_action"] == "NODE_REBOOT"
    assert recorded[1]["recovery_action"] == 12
    assert recorded[2]["field_errors"] == {230: "NOT_SUPPORTED"}

    def seen(source: str) -> list[tuple[Any, ...]]:
        report = recovery_report(capsys, source)
        return [(row["status"], row["values"], row.get("reason")) for row in report["entities"]
                ] + [(f["code"], f["severity"], f["message"]) for f in report["findings"]]

    assert seen(str(recording)) == seen(spec)
    assert ("RECOVERY_NODE_REBOOT", "EVICT") in [s[:2] for s in seen(str(recording))]
