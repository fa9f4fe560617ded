"""`healthd check` end to end on every bundled simulated machine: the real checks,
the real pynvml over the fake NVML library, the fake dcgmi, the simulated bandwidth
probe. Each fault spec yields exactly its code on exactly its GPU, and the exit code
follows the Nagios convention."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import pytest

from healthd.cli import main
from healthd.sim.machine import bundled_specs
from tests.conftest import gpu_present

# spec -> (expected problem findings as (code, entity label), exit code)
EXPECTED: dict[str, tuple[set[tuple[str, str]], int]] = {
    "healthy-8xh100": (set(), 0),
    "remap-pending": ({("REMAP_PENDING", "gpu3")}, 2),
    "remap-failure": ({("REMAP_FAILURE", "gpu2")}, 2),
    "recovery-node-reboot": ({("RECOVERY_NODE_REBOOT", "gpu2")}, 2),
    "hw-slowdown": ({("HW_SLOWDOWN", "gpu1")}, 1),
    "pcie-degraded": ({("PCIE_LINK_DEGRADED", "gpu4")}, 1),
    "pcie-bw-low": ({("PCIE_BW_LOW", "gpu4")}, 1),
    "ecc-uncorrected": ({("ECC_UNCORRECTED", "gpu0")}, 2),
    "nvlink-down": ({("NVLINK_DOWN", "gpu7")}, 2),
    "gpu-lost": ({("GPU_MISSING", "gpu6")}, 2),
    "gpu-missing": ({("GPU_MISSING", "node")}, 2),
    "xid79": ({("XID_79", "gpu5")}, 2),
    "mig-enabled": (set(), 0),
    "no-driver": (set(), 3),
    "dcgm-pcie-fail": ({("DCGM_PCIE", "gpu1")}, 2),
    "h100-vm-notsupported": (set(), 0),
    "hgx-h100-fabric-not-registered": ({("FABRIC_NOT_STARTED", f"gpu{i}") for i in range(8)}, 2),
    "hgx-h100-sxid-fatal": ({("SXID_12020", "nvswitch")}, 2),
}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict[str, Any], int]:
    code = main(["check", *args, "--output", "json"])
    return json.loads(capsys.readouterr().out), code


def problems(report: dict[str, Any]) -> set[tuple[str, str]]:
    found = set()
    for check in report["checks"]:
        for finding in check["findings"]:
            if finding["severity"] != "PASS":
                entity = finding["entity"]
                label = f"gpu{entity['index']}" if entity["kind"] == "gpu" else entity["kind"]
                found.add((finding["code"], label))
    return found


def test_every_bundled_spec_has_an_expectation() -> None:
    assert set(bundled_specs()) == set(EXPECTED)


@pytest.mark.parametrize("spec", sorted(EXPECTED))
def test_bundled_spec(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    expected_findings, expected_exit = EXPECTED[spec]
    report, code = run_json(capsys, "--sim", spec)
    assert problems(report) == expected_findings
    assert code == expected_exit == report["exit_code"]


def test_remap_pending_names_gpu_index_and_uuid(capsys: pytest.CaptureFixture[str]) -> None:
    report, code = run_json(capsys, "--sim", "remap-pending", "--checks", "remapped")
    (remapped,) = report["checks"]
    statuses = {e["entity"]["index"]: e for e in remapped["entities"]}
    assert statuses[3]["status"] == "ERR"
    assert statuses[3]["entity"]["uuid"].startswith("GPU-")
    assert all(statuses[i]["status"] == "PASS" for i in statuses if i != 3)
    (finding,) = remapped["findings"]
    assert finding["entity"]["uuid"] == statuses[3]["entity"]["uuid"]
    assert code == 2


def test_without_driver_one_line_and_exit_3() -> None:
    # The real pynvml fails to load the library on a machine without the driver.
    if gpu_present():
        pytest.skip("this machine has an NVIDIA driver")
    proc = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "check", "--checks", "remapped,power"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "healthd: NVIDIA driver not found: no GPU checks can run on this machine "
        "(try `healthd check --sim healthy-8xh100`)"
    ]


def _check_without_driver(*args: str) -> subprocess.CompletedProcess[str]:
    if gpu_present():
        pytest.skip("this machine has an NVIDIA driver")
    if shutil.which("ping") is None:
        pytest.skip("no ping executable")
    return subprocess.run([sys.executable, "-m", "healthd.cli", "check", *args],
                          capture_output=True, text=True, timeout=60)


def test_without_driver_a_network_check_is_shown_and_judged() -> None:
    # 240.0.0.1 is reserved (class E): nothing ever answers it.
    proc = _check_without_driver("--checks", "ping", "--peer", "far=240.0.0.1")
    assert proc.returncode == 1  # WARN: the one peer does not answer
    [row, *_] = [line for line in proc.stdout.splitlines() if line.startswith("ping ")]
    assert "PEER_UNREACHABLE" in row and "240.0.0.1" in row
    assert "driver" not in proc.stderr  # no GPU check was asked for


def test_without_driver_gpu_checks_are_one_line_and_count_as_unknown() -> None:
    proc = _check_without_driver("--checks", "ping,remapped", "--peer", "far=240.0.0.1")
    assert proc.returncode == 3  # remapped could not tell: UNKNOWN outranks WARN
    assert "PEER_UNREACHABLE" in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("remapped ")]
    assert proc.stderr.strip() == ("healthd: NVIDIA driver not found: GPU checks remapped "
                                   "cannot run on this machine: UNKNOWN")


def test_without_driver_the_problems_never_say_none() -> None:
    proc = _check_without_driver("--checks", "remapped,power,pvc")
    assert proc.returncode == 3
    problems = proc.stdout.split("Problems:\n", 1)[1].split("\n\n", 1)[0]
    assert "no problems found" not in problems  # the result is UNKNOWN, not clean
    assert problems.startswith("remapped, power: UNKNOWN (NVIDIA driver not found")
    assert proc.stdout.rstrip().endswith(": UNKNOWN (exit 3)")


def test_table_output_shows_rows_and_problems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--sim", "hw-slowdown", "--checks", "power"]) == 1
    out = capsys.readouterr().out
    gpu_rows = [line for line in out.splitlines() if line.startswith("power ")]
    assert len(gpu_rows) == 8 + 1  # eight GPUs, and the one again under Problems
    assert "HW_SLOWDOWN" in out and "sim-hw-slowdown: WARN (exit 1)" in out


def test_unknown_check_exit_64_lists_known(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "--sim", "healthy-8xh100", "--checks", "remapped,nope"])
    assert exit_info.value.code == 64
    err = capsys.readouterr().err
    assert "unknown check nope; known checks:" in err and "pciebw" in err


@pytest.mark.parametrize(
    "argv", [["check", "--output", "xml"], ["check", "--peer", "n2"], ["bogus"],
             ["check", "--checks", "ping", "--peer", "n2=notanip"],
             ["check", "--checks", "ping", "--peer", "n2=10.0.0.2,gpu-node-3"]]
)
def test_usage_errors_exit_64(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 64


def test_bad_spec_exit_78(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("faults:\n  - gpu: 9\n    lost: true\n")
    assert main(["check", "--sim", str(spec)]) == 78
    assert "fault names gpu 9 but the machine has 8 GPUs" in capsys.readouterr().err


def test_every_check_is_in_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "check", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    import checks

    for name in checks.REGISTRY:
        assert f"\n  {name}" in proc.stdout


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("healthd 0.")


def test_a_simulated_driverless_node_shows_what_a_real_one_does() -> None:
    proc = subprocess.run([sys.executable, "-m", "healthd.cli", "check", "--sim", "no-driver"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    rows = [line.split()[0] for line in proc.stdout.split("\n\n")[0].splitlines()[1:]]
    # Checks that need no GPU, and not a row of UNKNOWN per GPU check.
    assert rows == ["ping", "nic", "rdma", "pvc", "dcgm"]
    assert proc.stderr.startswith("healthd: NVIDIA driver not found: GPU checks gpus, ")
    assert "in use" not in proc.stdout  # DCGM finds no host engine, as without a driver
    assert "no host engine answers" in proc.stdout
