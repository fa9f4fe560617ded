"""Several simulated machines in one process: each caller sees its own node's GPUs
and faults, and an XID reaches only the node it happened on."""

from __future__ import annotations

import anyio
import pytest

from checks.snapshot import NvmlGpuSource, XidEvent
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
