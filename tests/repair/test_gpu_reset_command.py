"""`healthd gpu-reset`, as the GPU-reset Job's container runs it: on a simulated
machine named by a control file, through the simulated nvidia-smi, so the reset is
seen by anything else on that machine (the node's agent, a later check). It lets go
first: persistence mode off for the reset and on again after, whatever happens; its
own NVML session shut down before nvidia-smi runs. A GPU something still holds is
refused, naming what; each GPU is reset once; a name that is not a GPU UUID runs
nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.controller.reset_job import reset_command
from healthd.repair.command import Node, reset_gpus
from healthd.repair.holders import DeviceUser
from healthd.sim.holders import named_pid
from healthd.sim.kubelet import HealthdRunner
from healthd.sim.node import simulate
from tests.sim.holding import Machine, machine, nvml_holder

UNKNOWN = "GPU-00000000-0000-0000-0000-000000000000"
NO_PERSISTENCE = {"gpus": {"persistence_mode": False}}


def healthd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def gpu_reset(on: Machine, *uuids: str, log: Path | None = None,
              options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`healthd gpu-reset` on the machine, as the Job's command has it (`--` first)."""
    if log is not None:
        options += ("--termination-log", str(log))
    return healthd("gpu-reset", "--sim", str(on.spec_file), "--sim-control", str(on.control),
                   *options, "--", *uuids)


def last_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout.strip().splitlines()[-1])


def persistence(on: Machine) -> list[bool]:
    """Each GPU's persistence mode, as a process on the machine sees it now."""
    with simulate(on.spec, on.control) as node:
        return [node.nvml.persistence(g) for g in range(on.spec.gpus.count)]


def test_a_reset_clears_a_pending_remap_for_every_process_on_the_machine(
        tmp_path: Path) -> None:
    on = machine(tmp_path, "remap-pending")
    checked = ("check", "--sim", str(on.spec_file), "--sim-control", str(on.control),
               "--checks", "remapped")
    assert healthd(*checked).returncode == 2

    done = gpu_reset(on, on.uuid(3), log=tmp_path / "log")

    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "log").read_text())
    assert result == last_json(done)
    assert result["ok"] is True and result["outcome"] == "reset"
    assert "was successfully reset" in result["gpus"][0]["output"]
    assert healthd(*checked).returncode == 0


def test_persistence_mode_is_turned_off_for_the_reset_and_on_again(tmp_path: Path) -> None:
    on = machine(tmp_path)
    before = persistence(on)
    assert all(before)

    done = gpu_reset(on, on.uuid(2))

    assert done.returncode == 0, done.stdout + done.stderr
    gpu = last_json(done)["gpus"][0]
    assert gpu["holders"] == ["persistence mode (turned off for the reset)"]
    assert gpu["persistence_restored"] is True
    assert persistence(on) == before
    assert on.lines("persistence") == [{"op": "persistence", "gpu": 2, "enabled": False},
                                       {"op": "persistence", "gpu": 2, "enabled": True}]
    assert on.lines("gpu_reset") == [{"op": "gpu_reset", "gpu": 2}]


def test_a_gpu_another_process_holds_is_refused_naming_it_and_nothing_is_reset(
        tmp_path: Path) -> None:
    on = machine(tmp_path)
    with nvml_holder(on) as holder:
        done = gpu_reset(on, on.uuid(0), on.uuid(1), log=tmp_path / "log")

    assert done.returncode == 75, done.stdout + done.stderr
    result = json.loads((tmp_path / "log").read_text())
    assert (result["ok"], result["outcome"]) == (False, "refused")
    for index, gpu in enumerate(result["gpus"]):
        assert gpu["outcome"] == "refused" and gpu["exit_code"] == 255
        assert "In use by another client" in gpu["output"]
        process, persistence_mode = gpu["holders"]
        assert process.startswith(f"pid {holder.pid} (python")
        assert process.endswith(f": /dev/nvidia{index} open, /dev/nvidiactl open")
        assert persistence_mode == "persistence mode (turned off for the reset)"
        assert gpu["persistence_restored"] is True
    assert on.lines("gpu_reset") == []
    assert all(persistence(on))


def test_a_holder_that_died_holds_nothing(tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE)
    with nvml_holder(on) as holder:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        done = gpu_reset(on, on.uuid(4))
    assert done.returncode == 0, done.stdout + done.stderr
    assert last_json(done)["gpus"][0]["holders"] == []


def test_the_jobs_own_command_resets_on_the_nodes_machine(tmp_path: Path) -> None:
    on = machine(tmp_path)
    pod = {"spec": {"containers": [{"name": "gpu-reset", "image": "healthd",
                                    "command": reset_command([on.uuid(1)])}]}}
    ended = anyio.run(HealthdRunner(on.spec_file, control=on.control), pod)
    assert ended.exit_code == 0, ended.logs
    assert json.loads(ended.message)["outcome"] == "reset"
    assert on.lines("gpu_reset") == [{"op": "gpu_reset", "gpu": 1}]


def test_a_gpu_listed_twice_is_reset_once(tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE)
    done = gpu_reset(on, on.uuid(5), on.uuid(6), on.uuid(5))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [g["uuid"] for g in last_json(done)["gpus"]] == [on.uuid(5), on.uuid(6)]
    assert on.lines("gpu_reset") == [{"op": "gpu_reset", "gpu": 5}, {"op": "gpu_reset", "gpu": 6}]


def test_a_busy_gpu_is_refused_naming_its_processes_and_the_others_are_reset(
        tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE, faults=[{"gpu": 1, "busy": {"processes": 2}}],
                 holders=[{"name": "nv-hostengine", "gpus": [2]}])
    done = gpu_reset(on, on.uuid(0), on.uuid(1), on.uuid(2))
    assert done.returncode == 75
    gpus = last_json(done)["gpus"]
    assert [g["outcome"] for g in gpus] == ["reset", "refused", "refused"]
    engine = f"pid {named_pid('nv-hostengine')} (nv-hostengine)"
    assert gpus[1]["holders"] == [  # the driver's control device: every holder has it open
        *[f"pid {pid}: compute process, /dev/nvidia1 open, /dev/nvidiactl open"
          for pid in (40100, 40101)], f"{engine}: /dev/nvidiactl open"]
    assert gpus[2]["holders"][-1] == f"{engine}: /dev/nvidia2 open, /dev/nvidiactl open"
    assert on.lines("gpu_reset") == [{"op": "gpu_reset", "gpu": 0}]


def test_a_mig_gpu_with_instances_fails(tmp_path: Path) -> None:
    mig = machine(tmp_path / "mig", **NO_PERSISTENCE,
                  faults=[{"gpu": 0, "mig": True, "gpu_instances": 1}])
    done = gpu_reset(mig, mig.uuid(0))
    assert done.returncode == 1
    assert "GPU instances exist" in last_json(done)["gpus"][0]["output"]


A100_HGX = {"gpus": {"model": "NVIDIA A100-SXM4-80GB"}, "fabric": {"state": "completed"}}


def test_a_gpu_that_resets_only_with_its_board_is_reset_with_every_gpu_of_it(
        tmp_path: Path) -> None:
    a100 = machine(tmp_path / "a100", **A100_HGX)
    done = gpu_reset(a100, a100.uuid(3))
    assert done.returncode == 0, done.stdout + done.stderr
    gpus = last_json(done)["gpus"]
    assert [g["uuid"] for g in gpus] == [a100.uuid(i) for i in range(8)]
    assert {(g["outcome"], g["persistence_restored"]) for g in gpus} == {("reset", True)}
    assert "reset with every GPU of the board (an Ampere GPU on NVSwitches" in gpus[3]["output"]
    assert sorted(line["gpu"] for line in a100.lines("gpu_reset")) == list(range(8))
    assert all(persistence(a100))


def test_a_board_with_one_gpu_held_is_refused_whole(tmp_path: Path) -> None:
    a100 = machine(tmp_path / "a100", **A100_HGX,
                   holders=[{"name": "nv-hostengine", "gpus": [6]}])
    done = gpu_reset(a100, a100.uuid(3))
    assert done.returncode == 75
    gpus = last_json(done)["gpus"]
    assert {g["outcome"] for g in gpus} == {"refused"}
    assert any("nv-hostengine" in h for h in gpus[6]["holders"])
    assert a100.lines("gpu_reset") == [] and all(persistence(a100))


def test_a_hopper_gpu_on_nvswitches_is_reset_alone(tmp_path: Path) -> None:
    h100 = machine(tmp_path / "h100", base="hgx-h100-sxid-fatal", **NO_PERSISTENCE)
    done = gpu_reset(h100, h100.uuid(3))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [g["uuid"] for g in last_json(done)["gpus"]] == [h100.uuid(3)]
    assert h100.lines("gpu_reset") == [{"op": "gpu_reset", "gpu": 3}]


def test_a_name_that_is_no_gpu_uuid_is_a_usage_error_and_runs_nothing(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ntouch {ran}\n")
    smi.chmod(0o755)
    for names in (["3"], [UNKNOWN, "--nvidia-smi=/bin/true"], ["GPU-1"]):
        done = healthd("gpu-reset", "--nvidia-smi", str(smi), "--", *names)
        assert done.returncode == 64, done.stderr
        assert "not a GPU UUID" in done.stderr
    # The Job's own command line: a UUID that is an option stays a (bad) UUID.
    job = reset_command([UNKNOWN, f"--nvidia-smi={smi}"])
    assert healthd(*job[1:]).returncode == 64
    assert not ran.exists()


def test_an_unknown_uuid_is_no_device_and_a_failure(tmp_path: Path) -> None:
    done = gpu_reset(machine(tmp_path), UNKNOWN)
    assert done.returncode == 1
    assert "No devices were found" in done.stdout


def test_a_lost_gpu_cannot_be_reset_and_the_command_says_so(tmp_path: Path) -> None:
    on = machine(tmp_path, "gpu-lost", **NO_PERSISTENCE)
    with simulate(on.spec, on.control) as node:
        lost = next(i for i in range(8) if not node.nvml.reset_gpu(i))

    done = gpu_reset(on, on.uuid(0 if lost else 1), on.uuid(lost), log=tmp_path / "log")

    assert done.returncode == 1
    result = json.loads((tmp_path / "log").read_text())
    assert (result["ok"], result["outcome"]) == (False, "failed")
    assert [g["outcome"] for g in result["gpus"]] == ["reset", "failed"]
    assert "GPU is lost" in result["gpus"][1]["output"]


def test_without_nvidia_smi_the_reset_fails_with_the_reason(tmp_path: Path) -> None:
    done = healthd("gpu-reset", "--nvidia-smi", str(tmp_path / "absent"), "--", UNKNOWN)
    assert done.returncode == 1
    assert "cannot run" in done.stdout


def test_holders_only_names_them_and_changes_nothing(tmp_path: Path) -> None:
    on = machine(tmp_path)
    with nvml_holder(on) as holder:
        done = gpu_reset(on, on.uuid(7), UNKNOWN, options=("--holders-only",))
    assert done.returncode == 1  # one GPU NVML does not know
    found = json.loads(done.stdout)
    assert found["ok"] is False
    gpu7, unknown = found["gpus"]
    assert (gpu7["minor"], gpu7["persistence_mode"]) == (7, True)
    assert gpu7["holders"][0].startswith(f"pid {holder.pid} (python")
    assert gpu7["holders"][-1] == "persistence mode"
    assert "Not Found" in unknown["problem"]
    assert on.lines("persistence") == [] and on.lines("gpu_reset") == []


class _FailingProc:
    """A /proc that cannot be read past the first GPU (the command fails midway)."""

    def __init__(self) -> None:
        self.asked = 0

    def users(self, paths: Collection[str]) -> list[DeviceUser]:
        self.asked += 1
        if self.asked > 1:
            raise RuntimeError("/proc went away")
        return []

    def name(self, pid: int) -> str:
        return ""


def test_persistence_mode_is_put_back_when_the_command_fails_midway(tmp_path: Path) -> None:
    on = machine(tmp_path)
    with simulate(on.spec, on.control) as node:
        with pytest.raises(RuntimeError):
            reset_gpus(Node(_FailingProc(), node.nvidia_smi()), [on.uuid(0), on.uuid(1)])
        assert on.lines("persistence") == [{"op": "persistence", "gpu": 0, "enabled": False},
                                           {"op": "persistence", "gpu": 0, "enabled": True}]
        assert node.nvml.persistence(0) and node.nvml.persistence(1)
    assert on.lines("gpu_reset") == []
