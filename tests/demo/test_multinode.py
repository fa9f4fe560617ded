"""Several simulated machines in one process: each caller sees its own node's GPUs
and faults, an XID reaches only the node it happened on, and each node's machine is
the one its control file names for other processes."""

from __future__ import annotations

import subprocess
import time

import anyio
import pytest

from checks.snapshot import NvmlGpuSource, XidEvent
from healthd.sim.control import POLL_S
from healthd.sim.machine import GpuFault, RemappedRowsFault, load_machine_spec
from healthd.sim.multinode import simulate_nodes

pytestmark = pytest.mark.anyio


async def test_each_node_sees_its_own_machine() -> None:
    spec = load_machine_spec("healthy-8xh100")
    with simulate_nodes({"a": spec, "b": spec}) as fleet:
        fleet.nodes["b"].nvml.inject(GpuFault(gpu=3, remapped_rows=RemappedRowsFault(
            pending=True)))
        seen: dict[str, tuple[str, bool, list[XidEvent]]] = {}

        async def read(name: str) -> None:
            with fleet.bound(name):
                source = NvmlGpuSource()
                try:
                    gpu = (await source.snapshot()).gpus[3]
                    events = await source.xid_events(0.5)
                finally:
                    await source.aclose()
                seen[name] = (gpu.uuid, gpu.remapped.value.pending, events)  # type: ignore

        async with anyio.create_task_group() as group:
            group.start_soon(read, "a")
            group.start_soon(read, "b")
            await anyio.sleep(0.2)
            fleet.nodes["a"].nvml.emit_xid(1, 79)

    assert seen["a"][0] != seen["b"][0]  # two machines, two sets of UUIDs
    assert (seen["a"][1], seen["b"][1]) == (False, True)
    assert [(e.xid, e.gpu_index) for e in seen["a"][2]] == [(79, 1)]
    assert seen["b"][2] == []


def test_a_process_on_a_nodes_machine_finds_and_changes_what_the_fleet_does() -> None:
    """What the fleet changes through `change` is in the node's control file, so a
    process on that machine (a GPU-reset Job's nvidia-smi) finds it; what that process
    changes there (a reset) reaches the node here, and no other node."""
    spec = load_machine_spec("healthy-8xh100")
    with simulate_nodes({"a": spec, "b": spec}) as fleet:
        b = fleet.nodes["b"]
        fleet.change("b", {"op": "inject", "fault": {"gpu": 3, "recovery_action": "GPU_RESET"}})
        fleet.change("b", {"op": "inject", "fault": {"gpu": 5, "lost": True}})
        fleet.change("a", {"op": "inject", "fault": {"gpu": 3, "recovery_action": "GPU_RESET"}})
        assert b.control is not None
        written = b.control.read_text()
        with pytest.raises(ValueError, match="gpu"):
            fleet.change("b", {"op": "inject", "fault": {"gpu": 99}})
        assert b.control.read_text() == written  # a refused change is not written

        def nvidia_smi(uuid: str) -> subprocess.CompletedProcess[str]:
            assert b.control is not None
            return subprocess.run([*b.nvidia_smi(), "--gpu-reset", "-i", uuid],
                                  capture_output=True, text=True, timeout=60, check=False)

        lost = nvidia_smi(b.spec.uuid(5))
        assert lost.returncode == 1 and "GPU is lost" in lost.stderr
        # Persistence mode (on at boot) holds the GPU: off first, as a Job's reset does.
        fleet.change("b", {"op": "persistence", "gpu": 3, "enabled": False})
        reset = nvidia_smi(b.spec.uuid(3))
        assert reset.returncode == 0 and "successfully reset" in reset.stdout

        def recovery(node: str) -> list[object]:
            return [f.recovery_action for f in fleet.nodes[node].nvml.faults_for(3)]

        deadline = time.monotonic() + 20 * POLL_S
        while recovery("b") != [None] and time.monotonic() < deadline:
            time.sleep(POLL_S / 4)
        # Each change once: the follower, reading the file on, skipped the fleet's own.
        assert (recovery("a"), recovery("b")) == (["GPU_RESET"], [None])
