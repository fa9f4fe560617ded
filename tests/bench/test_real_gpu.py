"""bench/real_gpu.py, the real-GPU acceptance run: without a GPU it skips cleanly
(one JSON object saying why, exit 0); rehearsed on a simulated machine, every step
runs, the replay of the recording matches the machine, and pciebw beside a busy GPU 0
finds nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gpu_present

SCRIPT = Path(__file__).resolve().parent.parent.parent / "bench" / "real_gpu.py"


def run(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", *args], capture_output=True,
                          text=True, timeout=240, check=False)
    report: dict[str, Any] = json.loads(proc.stdout)
    return proc, report


def test_without_a_gpu_it_skips_cleanly() -> None:
    if gpu_present():
        pytest.skip("this machine has an NVIDIA GPU: the real run is not a skip")
    proc, report = run()
    assert proc.returncode == 0
    assert report["benchmark"] == "real_gpu"
    assert report["figures"] == {"skipped": "no NVIDIA GPU: NVIDIA driver not found"}
    assert report["goals"] == {}
    assert "skipped: no NVIDIA GPU here" in proc.stderr


def test_rehearsal_on_a_simulated_vm_runs_every_step() -> None:
    proc, report = run("--sim", "h100-vm-notsupported", "--agent-minutes", "0.1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures, goals = report["figures"], report["goals"]
    assert figures["gpus"] == 8 and figures["cuda_driver_version"] == 12080
    assert figures["nvml_readings"]["clock_event_reasons"] == {
        "unsupported:nvmlDeviceGetCurrentClocksEventReasons:NOT_SUPPORTED": 8}
    assert figures["nvml_readings"]["power"] == {"ok": 8}
    assert figures["fabric"] == {"none": 8}  # a VM: no NVLink fabric
    assert figures["kernel_log"]["readable"] is True
    assert figures["record_replay"]["record_exit_code"] == 0
    assert figures["record_replay"]["status_or_code_mismatches"] == []
    assert goals["replay_mismatches"]["value"] == 0
    assert [row["ratio"] for row in figures["pciebw"]] == [0.85] * 8  # the sim's 85 %
    assert figures["nvml_round"]["round_ms"]["n"] == 30
    assert figures["agent"]["rss_mib_peak"] > 0
    # pciebw beside each load on GPU 0: never a finding, GPU 0 not judged
    for mode in ("h2d", "compute", "both"):
        said = figures["pciebw_busy"][mode]
        assert said["codes"] == [] and said["gpu0_status"] == "SKIPPED"
        assert said["gpu0_reason"].startswith("busy: 1 process")
    assert goals["pciebw_busy_findings"]["value"] == 0
    # the agent's memory with pciebw measured (its child: the interpreter, no CUDA here)
    assert figures["agent_memory"]["pciebw"] == "PASS"
    assert figures["agent_memory"]["rss_mib_steady"] > 0
    if not gpu_present():  # the real child, started for real: no driver here
        assert figures["pciebw_child"]["answers"] == ["CUDA driver not found"]
    assert set(goals) >= {"gpu_tests_failed", "nvml_round_p99_ms", "pciebw_min_ratio",
                          "pciebw_busy_findings", "agent_rss_mib_peak",
                          "agent_cpu_pct_of_core_steady"}


def test_rehearsal_reads_fabric_state_and_the_kernel_log() -> None:
    proc, report = run("--sim", "hgx-h100-sxid-fatal", "--agent-minutes", "0.1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = report["figures"]
    assert figures["fabric"] == {"completed/SUCCESS": 8}
    assert figures["kernel_log"]["sxid_lines"] == {"12020": 1}
    assert figures["kernel_log"]["xid_pci_unmatched"] == []
    assert figures["record_replay"]["status_or_code_mismatches"] == []
