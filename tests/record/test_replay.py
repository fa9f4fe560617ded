"""`healthd record` then `healthd check --sim RECORDING` on every bundled machine:
the replay gives the same per-check statuses, reasons, findings and values as the
machine that was recorded, and recording a replay gives the same spec again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from healthd.cli import main
from healthd.sim.machine import bundled_specs, load_machine_spec

NO_DRIVER = "no-driver"
# The bundled XIDs, and a recording's, fire 0.5 s after the machine's start: a 1 s
# window that opens at once hears them all, as the check's own 1 s window does.
RECORD_ALL = ["--include", "pciebw", "--include", "dcgm", "--include", "xid-window=1s"]


def check_json(capsys: pytest.CaptureFixture[str], spec: str) -> dict[str, Any]:
    main(["check", "--sim", spec, "--output", "json"])
    return json.loads(capsys.readouterr().out)


def record(capsys: pytest.CaptureFixture[str], spec: str, out: Path, *extra: str) -> int:
    code = main(["record", "--sim", spec, "--output", str(out), *RECORD_ALL, *extra])
    capsys.readouterr()
    return code


# Checks that read no machine a recording holds (the network, the cluster): SKIPPED in
# the simulation for want of peers or storage, SKIPPED "not recorded" on replay.
NOT_RECORDED = {"ping", "nic", "pvc"}


# Values that are a time (when pciebw last judged a GPU), like a check's started_at.
TIMES = {"last_judged"}


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """What a user compares: everything but when the checks ran and how long they took,
    and why a check that a recording cannot hold was skipped."""
    checks = [{k: _timeless(v) if k == "entities" else v for k, v in check.items()
               if k not in ("started_at", "duration_s")
               and not (k == "reason" and check["check"] in NOT_RECORDED)}
              for check in report["checks"]]
    return {**report, "checks": checks}


def _timeless(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "values": {k: v for k, v in row["values"].items() if k not in TIMES}}
            for row in entities]


@pytest.mark.parametrize("spec", sorted(set(bundled_specs()) - {NO_DRIVER}))
def test_replay_of_a_recording_matches_the_recorded_machine(
        spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = check_json(capsys, spec)
    recording = tmp_path / "recorded.yaml"
    assert record(capsys, spec, recording) == 0
    replayed = check_json(capsys, str(recording))
    assert comparable(replayed) == comparable(original)


@pytest.mark.parametrize("spec", sorted(set(bundled_specs()) - {NO_DRIVER}))
def test_recording_a_replay_gives_the_same_spec(
        spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    assert record(capsys, spec, first) == 0
    assert record(capsys, str(first), second) == 0
    assert yaml.safe_load(second.read_text()) == yaml.safe_load(first.read_text())
    assert load_machine_spec(second) == load_machine_spec(first)


# A machine with what real nodes show and the bundled specs do not: per-GPU errors
# (newer NVML codes too), a failed handle lookup, one GPU without NVLink among GPUs
# with it, no clock event reason at all and bits newer than the named ones, a GPU
# whose slot is only Gen4, page retirement, and MIG on a GPU.
ODD_MACHINE: dict[str, Any] = {
    "node": "odd-node",
    "gpus": {"count": 6, "page_retirement": True, "pcie_bandwidth_gbps": {"h2d": 50.5}},
    "faults": [
        {"gpu": 0, "clock_event_mask": 0},
        {"gpu": 1, "clock_event_mask": 0x401, "pcie": {"gen": 4, "max_gen": 4}},
        {"gpu": 2, "nvml_errors": [
            {"function": "nvmlDeviceGetNvLinkState", "error": "NOT_SUPPORTED"},
            {"function": "nvmlDeviceGetEnforcedPowerLimit", "error": "NO_DATA"},
            {"function": "nvmlDeviceGetRemappedRows", "error": "UNKNOWN"}]},
        {"gpu": 3, "nvml_errors": [
            {"function": "nvmlDeviceGetHandleByIndex", "error": "NO_PERMISSION"}]},
        {"gpu": 4, "ecc": {"corrected_volatile": 3, "retired_pages_pending": True},
         "pcie_replays": 12, "power": {"usage_w": 312.25, "limit_w": 650}},
        {"gpu": 5, "mig": True, "nvlink_down": [17]},
    ],
}


def test_replay_keeps_per_gpu_errors_masks_and_links(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "odd.yaml"
    spec.write_text(yaml.safe_dump(ODD_MACHINE))
    recording = tmp_path / "recorded.yaml"
    assert record(capsys, str(spec), recording) == 0
    assert comparable(check_json(capsys, str(recording))) == comparable(
        check_json(capsys, str(spec)))
    recorded = yaml.safe_load(recording.read_text())
    by_gpu = {entry["gpu"]: entry for entry in recorded["faults"]}
    def functions(entry: dict[str, Any]) -> list[tuple[str, str]]:
        return sorted((e["function"], e["error"]) for e in entry["nvml_errors"])

    assert functions(by_gpu[2]) == functions(ODD_MACHINE["faults"][2])
    assert by_gpu[1]["clock_event_mask"] == 0x401


def test_a_kernel_log_that_was_not_recorded_replays_as_skipped_never_pass(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "unreadable-log.yaml"
    spec.write_text(yaml.safe_dump({"node": "hgx", "fabric": {},
                                    "recorded": ["nvml", "xid", "rdma"]}))  # no log
    recording = tmp_path / "recorded.yaml"
    assert record(capsys, str(spec), recording) == 0
    assert "kernel_log" not in yaml.safe_load(recording.read_text())["recorded"]
    (sxid,) = [c for c in check_json(capsys, str(recording))["checks"] if c["check"] == "sxid"]
    assert sxid["status"] == "SKIPPED"
    assert sxid["reason"] == "not recorded: kernel_log"


def test_kernel_log_lines_replay_to_the_same_findings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "logged.yaml"
    spec.write_text(yaml.safe_dump({"node": "hgx", "fabric": {}, "kernel_log": [
        "NVRM: Xid (PCI:0000:28:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"]}))
    recording = tmp_path / "recorded.yaml"
    assert record(capsys, str(spec), recording) == 0
    replayed = comparable(check_json(capsys, str(recording)))
    assert replayed == comparable(check_json(capsys, str(spec)))
    codes = {f["code"] for c in replayed["checks"] for f in c["findings"]}
    assert {"XID_79", "SXID_20034"} <= codes


@pytest.mark.parametrize(("spec", "include"), [
    ("healthy-8xh100", []),
    ("dcgm-pcie-fail", ["--include", "pciebw"]),
    ("pcie-bw-low", ["--include", "dcgm"]),
])
def test_what_a_recording_does_not_hold_replays_as_not_recorded(
        spec: str, include: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    recording = tmp_path / "recorded.yaml"
    assert main(["record", "--sim", spec, "--output", str(recording), *include]) == 0
    capsys.readouterr()
    replayed = {c["check"]: c for c in check_json(capsys, str(recording))["checks"]}
    held = set(yaml.safe_load(recording.read_text())["recorded"])
    for name in ("pciebw", "dcgm"):
        if name in held:
            continue
        assert replayed[name]["status"] == "SKIPPED", replayed[name]
        assert replayed[name]["reason"] == f"not recorded: {name}"
    assert held == {"nvml", "xid", "kernel_log", "rdma", "aer",
                    *[v for v in include if v != "--include"]}
    assert replayed["remapped"]["status"] == "PASS"  # what it holds still replays
