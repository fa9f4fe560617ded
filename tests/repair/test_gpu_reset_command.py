"""`healthd gpu-reset`, as the GPU-reset Job's container runs it: on a simulated
machine named by a control file, through the simulated nvidia-smi, so the reset is
seen by anything else on that machine (the node's agent, a later check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from healthd.sim.machine import load_machine_spec
from healthd.sim.node import simulate


def healthd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def machine(tmp_path: Path, spec: str) -> tuple[Path, Path, list[str]]:
    """A machine's spec file and control file, and its GPUs' UUIDs."""
    loaded = load_machine_spec(spec).model_copy(update={"node": "gpu-node-1"})
    spec_file, control = tmp_path / "spec.json", tmp_path / "control"
    spec_file.write_text(loaded.model_dump_json())
    control.touch()
    return spec_file, control, [loaded.uuid(i) for i in range(loaded.gpus.count)]


def test_a_reset_clears_a_pending_remap_for_every_process_on_the_machine(
        tmp_path: Path) -> None:
    spec, control, uuids = machine(tmp_path, "remap-pending")
    before = healthd("check", "--sim", str(spec), "--sim-control", str(control),
                     "--checks", "remapped")
    assert before.returncode == 2, before.stdout

    done = healthd("gpu-reset", uuids[3], "--sim", str(spec), "--sim-control", str(control),
                   "--termination-log", str(tmp_path / "log"))

    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "log").read_text())
    assert result["ok"] is True
    assert "was successfully reset" in result["gpus"][0]["output"]
    after = healthd("check", "--sim", str(spec), "--sim-control", str(control),
                    "--checks", "remapped")
    assert after.returncode == 0, after.stdout


def test_a_lost_gpu_cannot_be_reset_and_the_command_says_so(tmp_path: Path) -> None:
    spec, control, uuids = machine(tmp_path, "gpu-lost")
    with simulate(spec, control) as node:
        lost = next(i for i in range(8) if not node.nvml.reset_gpu(i))

    done = healthd("gpu-reset", uuids[0 if lost else 1], uuids[lost], "--sim", str(spec),
                   "--sim-control", str(control), "--termination-log", str(tmp_path / "log"))

    assert done.returncode == 1
    result = json.loads((tmp_path / "log").read_text())
    assert result["ok"] is False
    assert [g["ok"] for g in result["gpus"]] == [True, False]
    assert "GPU is lost" in result["gpus"][1]["output"]


def test_an_unknown_uuid_is_no_device_and_a_failure(tmp_path: Path) -> None:
    spec, control, _ = machine(tmp_path, "healthy-8xh100")
    done = healthd("gpu-reset", "GPU-00000000-0000-0000-0000-000000000000", "--sim", str(spec),
                   "--sim-control", str(control))
    assert done.returncode == 1
    assert "No devices were found" in done.stdout


def test_a_name_that_is_no_uuid_is_a_usage_error() -> None:
    done = healthd("gpu-reset", "3")
    assert done.returncode == 64
    assert "UUID" in done.stderr


def test_without_nvidia_smi_the_reset_fails_with_the_reason(tmp_path: Path) -> None:
    done = healthd("gpu-reset", "GPU-1", "--nvidia-smi", str(tmp_path / "absent"))
    assert done.returncode == 1
    assert "cannot run" in done.stdout
