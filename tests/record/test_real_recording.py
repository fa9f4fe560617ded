"""The recording of a real NVIDIA H200 (driver 580.159.04, a VM, PCIe Gen5 x16, no
NVLink, no NVSwitch, no DCGM) replays to what the real run said: PASS, with the real
machine's quirks (NVLink and fabric not supported, one PCIe replay) and the same
reason texts; and the simulation's defaults for such a machine say the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from checks.nvml_reader import NO_FABRIC
from healthd.cli import main
from healthd.sim.machine import MachineSpec, load_machine_spec

RECORDING = Path(__file__).parent / "recordings" / "h200-vm.yaml"


def _check(capsys: pytest.CaptureFixture[str], spec: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "--sim", spec, "--checks", "all", "--output", "json"])
    return code, json.loads(capsys.readouterr().out)


def _rows(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    (found,) = [c for c in report["checks"] if c["check"] == check]
    return list(found["entities"])


def _statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report["checks"]}


def test_the_real_h200_replays_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _check(capsys, str(RECORDING))
    assert code == 0 and report["status"] == "PASS"
    statuses = _statuses(report)
    for judged in ("gpus", "remapped", "power", "pcie", "ecc", "xid", "pciebw"):
        assert statuses[judged] == "PASS", judged
    # What the recording does not hold is never a PASS.
    assert {statuses[c] for c in ("ping", "nic", "pvc", "dcgm")} == {"SKIPPED"}


def test_the_real_machines_quirks_replay_with_the_real_reasons(
        capsys: pytest.CaptureFixture[str]) -> None:
    _, report = _check(capsys, str(RECORDING))
    (fabric,) = _rows(report, "fabric")
    assert fabric["status"] == "SKIPPED" and fabric["reason"].endswith(NO_FABRIC)
    (nvlink,) = _rows(report, "nvlink")
    assert nvlink["status"] == "SKIPPED" and "not supported" in nvlink["reason"]
    (pcie,) = _rows(report, "pcie")
    assert pcie["status"] == "PASS" and pcie["values"]["pcie_replays"] == 1
    (bw,) = _rows(report, "pciebw")
    assert bw["status"] == "PASS"
    assert round(bw["values"]["h2d_gbps"], 1) == 55.4


def test_the_simulations_defaults_for_such_a_machine_say_what_the_real_one_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A spec that says only what the real machine is (one H200, no NVLinks, no fabric)
    gives the statuses and reason texts the real run gave."""
    base = load_machine_spec("healthy-8xh100").model_dump(exclude_unset=True)
    spec = MachineSpec.model_validate({**base, "node": "h200-sim", "gpus": {
        "count": 1, "model": "NVIDIA H200", "nvlinks": 0}})
    path = tmp_path / "h200-sim.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json", exclude_unset=True)))
    _, simulated = _check(capsys, str(path))
    _, real = _check(capsys, str(RECORDING))
    for check in ("fabric", "nvlink"):
        assert [(r["status"], r.get("reason")) for r in _rows(simulated, check)] == [
            (r["status"], r.get("reason")) for r in _rows(real, check)], check
