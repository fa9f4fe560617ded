"""`healthd record` as a user runs it (a subprocess): what it writes, how it redacts,
and how it says no."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from healthd.sim.machine import load_machine_spec
from tests.conftest import gpu_present


def healthd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def recorded(*args: str) -> dict[str, Any]:
    proc = healthd("record", "--include", "xid-window=0", *args)
    assert proc.returncode == 0, proc.stderr
    spec: dict[str, Any] = yaml.safe_load(proc.stdout)
    return spec


def test_without_a_driver_it_says_so_and_exits_3() -> None:
    proc = healthd("record", "--sim", "no-driver")
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert "NVIDIA driver not found" in proc.stderr


def test_a_recording_names_every_gpu_and_what_nvml_refused() -> None:
    spec = recorded("--sim", "h100-vm-notsupported")
    original = load_machine_spec("h100-vm-notsupported")
    assert spec["driver_version"] == "570.133.20" and spec["cuda_driver_version"] == 12080
    assert spec["gpus"]["uuids"] == [original.uuid(i) for i in range(8)]
    assert spec["gpus"]["pci_bus_ids"] == [original.pci_bus_id(i) for i in range(8)]
    assert spec["gpus"]["unsupported"] == ["nvmlDeviceGetCurrentClocksEventReasons"]
    assert spec["gpus"]["nvlinks"] == 0


def test_per_gpu_errors_and_values_are_kept() -> None:
    spec = recorded("--sim", "gpu-lost")
    assert {"gpu": 6, "lost": True} in spec["faults"]
    spec = recorded("--sim", "pcie-degraded")
    assert {"gpu": 4, "pcie": {"gen": 3, "width": 8, "max_gen": 5, "max_width": 16}} \
        in spec["faults"]


def test_redact_replaces_uuids_serials_and_node_consistently(tmp_path: Path) -> None:
    plain = recorded("--sim", "dcgm-pcie-fail", "--include", "dcgm")
    redacted = recorded("--sim", "dcgm-pcie-fail", "--include", "dcgm", "--redact")
    text = yaml.safe_dump(redacted)
    for uuid in plain["gpus"]["uuids"]:
        assert uuid not in text
    assert "1652223014100" in plain["dcgm"]["stdout"]  # a serial DCGM printed
    assert "1652223014100" not in redacted["dcgm"]["stdout"]
    assert redacted["node"] != plain["node"]
    assert len(set(redacted["gpus"]["uuids"])) == 8
    # the recording still replays: same findings on the same GPU index
    path = tmp_path / "redacted.yaml"
    path.write_text(text)
    proc = healthd("check", "--sim", str(path), "--checks", "dcgm")
    assert proc.returncode == 2 and "DCGM_PCIE" in proc.stdout


def test_a_bad_include_is_a_usage_error() -> None:
    proc = healthd("record", "--sim", "healthy-8xh100", "--include", "everything")
    assert proc.returncode == 64
    assert "xid-window=D, pciebw or dcgm" in proc.stderr


def test_on_this_machine_without_a_driver_it_exits_3() -> None:
    if gpu_present():
        pytest.skip("this machine has an NVIDIA driver")
    proc = healthd("record", "--include", "xid-window=0")
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr.strip() == ("healthd: NVIDIA driver not found: nothing to record on "
                                   "this machine")


@pytest.mark.parametrize("where", ["missing-dir/x.yaml", "."])
def test_an_output_that_cannot_be_written_is_refused_before_recording(
        tmp_path: Path, where: str) -> None:
    output = tmp_path / where
    proc = healthd("record", "--sim", "healthy-8xh100", "--include", "xid-window=30s",
                   "--output", str(output))
    assert proc.returncode == 73, proc.stderr  # EX_CANTCREAT, at once: not after 30 s
    assert "Traceback" not in proc.stderr
    assert str(output) in proc.stderr and "--output" in proc.stderr
