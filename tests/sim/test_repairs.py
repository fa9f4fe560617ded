"""A GPU reset and a reboot on the simulated machine, read back through the real
pynvml: a reset clears what a reset clears on a real GPU (a pending remap, pending
retired pages, volatile ECC counts, a recovery action of GPU_RESET) and nothing else
(a lost GPU, a remap failure, a reboot the driver asks for); a reboot clears what is
volatile and keeps what the InfoROM keeps; a fault marked `hardware` survives both;
and both reach the machine through its control file."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from healthd.sim.machine import GpuFault, RemappedRowsFault
from healthd.sim.node import simulate
from tests.sim.conftest import Machine, StepClock
from tests.sim.test_control import _until

N = pynvml
GPUS = {"count": 4, "page_retirement": True}


def handle(index: int) -> object:
    return N.nvmlDeviceGetHandleByIndex(index)


def remap_pending(gpu: int) -> bool:
    return bool(N.nvmlDeviceGetRemappedRows(handle(gpu))[2])


def remap_failed(gpu: int) -> bool:
    return bool(N.nvmlDeviceGetRemappedRows(handle(gpu))[3])


def pages_pending(gpu: int) -> bool:
    return N.nvmlDeviceGetRetiredPagesPendingStatus(handle(gpu)) == N.NVML_FEATURE_ENABLED


def lost(gpu: int) -> bool:
    try:
        handle(gpu)
    except N.NVMLError_GpuIsLost:
        return True
    return False


def test_a_reset_clears_what_a_reset_clears_on_that_gpu_only(machine: Machine) -> None:
    fake = machine(gpus=GPUS, faults=[
        {"gpu": 1, "remapped_rows": {"correctable": 2, "pending": True},
         "ecc": {"uncorrected_volatile": 3, "retired_pages_pending": True},
         "recovery_action": "GPU_RESET"},
        {"gpu": 2, "remapped_rows": {"pending": True}}])
    assert remap_pending(1) and pages_pending(1) and fake.state(1).recovery_action == 1
    assert fake.reset_gpu(1)
    assert not remap_pending(1) and not pages_pending(1)
    assert fake.state(1).recovery_action == 0
    assert N.nvmlDeviceGetRemappedRows(handle(1))[0] == 2  # the rows stay remapped
    assert remap_pending(2)  # another GPU's fault is its own


@pytest.mark.parametrize("fault", [{"remapped_rows": {"failure": True}},
                                   {"recovery_action": "NODE_REBOOT"},
                                   {"remapped_rows": {"pending": True}, "hardware": True}],
                         ids=["remap failure", "reboot asked", "hardware"])
def test_a_reset_leaves_what_it_cannot_clear(machine: Machine, fault: dict[str, object]) -> None:
    fake = machine(gpus=GPUS, faults=[{"gpu": 0, **fault}])
    before = fake.state(0)
    assert fake.reset_gpu(0)
    assert fake.state(0) == before


def test_a_reset_cannot_reach_a_lost_gpu(machine: Machine) -> None:
    fake = machine(gpus=GPUS, faults=[{"gpu": 3, "lost": True,
                                       "remapped_rows": {"pending": True}}])
    assert not fake.reset_gpu(3)
    assert lost(3)
    assert fake.state(3).remapped.pending


def test_a_reboot_keeps_the_inforom_and_the_hardware(machine: Machine) -> None:
    fake = machine(gpus=GPUS, faults=[
        {"gpu": 0, "lost": True, "recovery_action": "NODE_REBOOT"},
        {"gpu": 1, "remapped_rows": {"uncorrectable": 4, "failure": True, "pending": True}},
        {"gpu": 2, "lost": True, "hardware": True},
        {"gpu": 3, "ecc": {"retired_pages_pending": True}, "xid": [{"code": 79, "at": 50}]}])
    fake.reboot()
    N.nvmlInit()  # the driver started again: no session survived
    assert not lost(0) and fake.state(0).recovery_action == 0
    assert remap_failed(1) and not remap_pending(1)
    assert N.nvmlDeviceGetRemappedRows(handle(1))[1] == 4
    assert lost(2)
    assert not pages_pending(3)


def test_a_fault_due_later_still_comes(machine: Machine, clock: StepClock) -> None:
    fake = machine(gpus=GPUS, faults=[{"gpu": 0, "at": 100, "remapped_rows": {"pending": True}}])
    assert fake.reset_gpu(0)
    fake.reboot()
    N.nvmlInit()
    clock.t = 100
    assert remap_pending(0)


def test_the_control_file_resets_and_reboots(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    control = tmp_path / "control.jsonl"
    with simulate("healthy-8xh100", control) as node:
        N.nvmlInit()
        try:
            node.nvml.inject(GpuFault(gpu=2, remapped_rows=RemappedRowsFault(pending=True)))
            node.nvml.inject(GpuFault(gpu=5, lost=True))
            assert remap_pending(2)
            _write(control, {"op": "gpu_reset", "gpu": 2}, {"op": "gpu_reset", "gpu": 5})
            assert _until(lambda: not remap_pending(2))
            assert _until(lambda: "the reset cannot reach gpu 5" in caplog.text)
            _write(control, {"op": "reboot"})
            assert _until(lambda: not node.nvml.faults_for(5))
            N.nvmlInit()  # the driver started again
            assert not lost(5)
        finally:
            N.nvmlShutdown()


def _write(path: Path, *commands: object) -> None:
    with open(path, "a") as handle_:
        for command in commands:
            handle_.write(json.dumps(command) + "\n")
