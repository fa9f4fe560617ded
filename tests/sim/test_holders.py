"""The simulated nvidia-smi is as strict as the real one: it refuses to reset a GPU
anything holds (another process's NVML session, a busy fault's processes, persistence
mode, a named holder), with the real tool's words and exit status and without naming
who; it resets once they let go, and a holder that died holds nothing. A MIG GPU with
GPU instances cannot be reset, and on boards whose GPUs reset only together, one GPU
alone cannot. Persistence mode is machine state: on at boot, changed by NVML or
`nvidia-smi -pm` for every process on the machine, back on after a reboot."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pynvml
import pytest

from healthd.sim.holders import held
from healthd.sim.node import simulate
from tests.sim.conftest import Machine as FakeMachine
from tests.sim.holding import Machine, machine, nvml_holder, spec_with
from tests.sim.test_control import _append, _until

N = pynvml
IN_USE = "GPU 00000000:18:00.0: In use by another client"
NO_PERSISTENCE = {"gpus": {"persistence_mode": False}}


def test_another_process_with_nvml_open_holds_every_gpu_until_it_shuts_down(
        tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE)
    with nvml_holder(on) as holder:
        refused = on.smi("--gpu-reset", "-i", on.uuid(0))
        assert refused.returncode == 255
        assert refused.stderr.startswith("The following GPUs could not be reset:\n  " + IN_USE)
        assert "1 device is currently being used by one or more other processes" in refused.stderr
        assert str(holder.pid) not in refused.stderr  # the real tool names no one
        assert on.lines("gpu_reset") == []
    done = on.smi("--gpu-reset", "-i", on.uuid(0))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "GPU 00000000:18:00.0 was successfully reset.\nAll done.\n"
    assert on.lines("gpu_reset") == [{"op": "gpu_reset", "gpu": 0}]


def test_a_session_ends_at_the_last_shutdown(tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE)
    with simulate(on.spec, on.control):
        N.nvmlInit()
        N.nvmlInit()
        N.nvmlShutdown()
        assert on.smi("--gpu-reset", "-i", on.uuid(0)).returncode == 255
        N.nvmlShutdown()
        assert on.smi("--gpu-reset", "-i", on.uuid(0)).returncode == 0


def test_a_holder_that_died_holds_nothing(tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE)
    with nvml_holder(on) as holder:
        assert on.smi("--gpu-reset", "-i", on.uuid(2)).returncode == 255
        os.kill(holder.pid, signal.SIGKILL)  # no nvmlShutdown: its registration stays
        holder.wait(timeout=30)
        assert list((on.control.parent / "control.machine" / "holders").glob("nvml-*"))
        assert on.smi("--gpu-reset", "-i", on.uuid(2)).returncode == 0


def test_persistence_mode_is_on_at_boot_and_refuses_the_reset_until_turned_off(
        tmp_path: Path) -> None:
    on = machine(tmp_path)
    assert on.smi("--gpu-reset", "-i", on.uuid(0)).returncode == 255
    off = on.smi("-pm", "0", "-i", on.uuid(0))
    assert off.stdout == "Disabled persistence mode for GPU 00000000:18:00.0.\nAll done.\n"
    assert on.smi("-pm", "0", "-i", on.uuid(0)).stdout.startswith(
        "Persistence mode is already Disabled for GPU 00000000:18:00.0.")
    assert on.smi("--gpu-reset", "-i", on.uuid(0)).returncode == 0
    assert on.smi("--gpu-reset", "-i", on.uuid(1)).returncode == 255  # still on there


def test_persistence_mode_set_through_nvml_reaches_every_process_and_a_reboot_restores_it(
        tmp_path: Path) -> None:
    on = machine(tmp_path)
    with simulate(on.spec, on.control) as node:
        N.nvmlInit()
        try:
            handle = N.nvmlDeviceGetHandleByIndex(3)
            assert N.nvmlDeviceGetPersistenceMode(handle) == N.NVML_FEATURE_ENABLED
            N.nvmlDeviceSetPersistenceMode(handle, N.NVML_FEATURE_DISABLED)
            assert N.nvmlDeviceGetPersistenceMode(handle) == N.NVML_FEATURE_DISABLED
            with pytest.raises(N.NVMLError_InvalidArgument):
                N.nvmlDeviceSetPersistenceMode(handle, 7)
            # Another process on the machine finds it off.
            assert "already Disabled" in on.smi("-pm", "0", "-i", on.uuid(3)).stdout
            on.smi("-pm", "1", "-i", on.uuid(3))  # and turns it on again: this one sees it
            assert _until(lambda: N.nvmlDeviceGetPersistenceMode(handle) == 1)
            N.nvmlDeviceSetPersistenceMode(handle, N.NVML_FEATURE_DISABLED)
            _append(on.control, {"op": "reboot"})
            assert _until(lambda: node.nvml.persistence(3))
            N.nvmlInit()  # the driver started again: no session survived
        finally:
            N.nvmlShutdown()


def test_busy_processes_and_named_holders_hold_their_gpus_only(tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE,
                 faults=[{"gpu": 1, "busy": {"processes": 2}}],
                 holders=[{"name": "nv-hostengine", "gpus": [2]},
                          {"name": "nightly-dcgm", "at": 3600}])  # not yet
    assert on.smi("--gpu-reset", "-i", on.uuid(1)).returncode == 255
    assert on.smi("--gpu-reset", "-i", on.uuid(2)).returncode == 255
    with held(on.control, "device-plugin-pod", [3]):
        assert on.smi("--gpu-reset", "-i", on.uuid(3)).returncode == 255
        assert on.smi("--gpu-reset", "-i", on.uuid(0)).returncode == 0
    assert on.smi("--gpu-reset", "-i", on.uuid(3)).returncode == 0
    assert [c["gpu"] for c in on.lines("gpu_reset")] == [0, 3]


def test_one_held_gpu_refuses_a_reset_of_several_and_none_is_reset(tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE, holders=[{"name": "dcgm", "gpus": [4, 5]}])
    refused = on.smi("--gpu-reset", "-i", ",".join(on.uuid(g) for g in (3, 4, 5)))
    assert refused.returncode == 255
    assert "2 devices are currently being used" in refused.stderr
    assert "00000000:58:00.0: In use" in refused.stderr  # GPU 4
    assert "00000000:48:00.0" not in refused.stderr  # GPU 3: free, but not reset either
    assert on.lines("gpu_reset") == []


def test_a_mig_gpu_with_gpu_instances_cannot_be_reset(tmp_path: Path) -> None:
    on = machine(tmp_path, **NO_PERSISTENCE, faults=[
        {"gpu": 0, "mig": True, "gpu_instances": 2}, {"gpu": 1, "mig": True}])
    refused = on.smi("--gpu-reset", "-i", on.uuid(0))
    assert refused.returncode == 255
    assert "00000000:18:00.0: MIG mode is enabled and GPU instances exist" in refused.stderr
    assert on.smi("--gpu-reset", "-i", on.uuid(1)).returncode == 0  # MIG mode, no instance


A100_BOARD = {"gpus": {"model": "NVIDIA A100-SXM4-80GB", "persistence_mode": False},
              "fabric": {"state": "completed"}}


def test_an_a100_nvswitch_board_resets_all_its_gpus_together_or_none(tmp_path: Path) -> None:
    on = machine(tmp_path, **A100_BOARD)
    alone = on.smi("--gpu-reset", "-i", on.uuid(5))
    assert alone.returncode == 255
    assert "cannot be reset alone on this system" in alone.stderr
    with held(on.control, "nv-hostengine", [7]):
        assert on.smi("--gpu-reset").returncode == 255  # all of them, but one is held
    every = on.smi("--gpu-reset")
    assert every.returncode == 0, every.stderr
    assert every.stdout.count("was successfully reset.") == 8
    listed = on.smi("--gpu-reset", "-i", ",".join(on.uuid(g) for g in range(8)))
    assert listed.returncode == 0
    assert len(on.lines("gpu_reset")) == 16


@pytest.mark.parametrize(("fields", "alone"), [
    ({}, True),  # H100
    ({"fabric": {}}, True),  # HGX H100: Hopper resets one GPU on NVSwitch
    ({"gpus": {"model": "NVIDIA A100-SXM4-80GB"}, "fabric": {}}, False),
    ({"gpus": {"model": "NVIDIA A100 80GB PCIe", "nvlinks": 12}}, True),  # no NVSwitch
    ({"gpus": {"model": "Tesla V100-SXM2-32GB", "page_retirement": True}}, False),
    ({"gpus": {"model": "Tesla V100-PCIE-32GB", "nvlinks": 0}}, True),  # no NVLink
    ({"gpus": {"model": "NVIDIA A100-SXM4-80GB", "reset_alone": True}, "fabric": {}}, True),
], ids=["h100", "hgx-h100", "hgx-a100", "a100-pcie", "dgx-v100", "v100-pcie", "said"])
def test_which_boards_reset_one_gpu_alone(fields: dict[str, Any], alone: bool) -> None:
    assert spec_with(**fields).resets_alone() is alone


def test_persistence_mode_in_one_process_alone(machine: FakeMachine) -> None:
    fake = machine(gpus={"count": 2, "persistence_mode": False})
    handle = N.nvmlDeviceGetHandleByIndex(1)
    assert N.nvmlDeviceGetPersistenceMode(handle) == N.NVML_FEATURE_DISABLED
    N.nvmlDeviceSetPersistenceMode(handle, N.NVML_FEATURE_ENABLED)
    assert fake.persistence(1) and not fake.persistence(0)
    fake.reboot()
    assert not fake.persistence(1)


def test_bad_holder_lines_change_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    on: Machine = machine(tmp_path, **NO_PERSISTENCE)
    _append(on.control, {"op": "hold", "name": "x", "gpus": [8]},
            {"op": "hold", "name": "y", "gpus": "some"}, {"op": "release", "name": "z"},
            {"op": "persistence", "gpu": 0, "enabled": "no"})
    with simulate(on.spec, on.control) as node:
        assert node.holders.named(0) == [] and not node.nvml.persistence(0)
    assert caplog.text.count("sim control: skipped") == 4
