"""NvmlGpuSource, the async GpuSource, over the fake NVML library:

- one read per round, shared by concurrent callers; `new_round()` reads again, even
  when a read of the old round is still in flight;
- XIDs: a scheduled XID arrives within the window with the right GPU index and
  UUID; XIDs queued between windows are not lost; `watch_xids()` streams them and
  every XID reaches both kinds of consumer;
- no driver: empty XID windows and a driver error, no crash;
- cancelling a long XID window returns promptly (short waits in a loop);
- a long XID wait in flight never holds up a round's read, nor a window, which
  collects what the running watch receives.
"""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from checks.snapshot import NodeSnapshot, NvmlGpuSource, RemappedRows, XidEvent
from healthd.sim.fakenvml import install
from healthd.sim.machine import GpuFault, load_machine_spec
from tests.sim.conftest import Machine

pytestmark = pytest.mark.anyio


async def test_one_read_per_round(machine: Machine) -> None:
    fake = machine(init=False, gpus={"count": 2})
    source = NvmlGpuSource()
    first, second = [], []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append(source, first))
        tg.start_soon(lambda: _append(source, second))
    assert first[0] is second[0]
    assert fake.library.calls["nvmlDeviceGetCount_v2"] == 1  # concurrent callers shared it
    fake.inject(GpuFault(gpu=1, remapped_rows={"failure": True}))  # type: ignore[arg-type]
    assert (await source.snapshot()).gpus[1].remapped == first[0].gpus[1].remapped  # cached
    source.new_round()
    remapped = (await source.snapshot()).gpus[1].remapped
    assert remapped.value == RemappedRows(0, 0, False, True)  # type: ignore[union-attr]
    await source.aclose()


async def _append(source: NvmlGpuSource, into: list[object]) -> None:
    into.append(await source.snapshot())


async def test_scheduled_xid_arrives_within_the_window() -> None:
    spec = load_machine_spec("xid79")  # XID 79 on GPU 5 at 0.5 s
    with install(spec):
        source = NvmlGpuSource(poll_ms=50)
        started = time.monotonic()
        events = await source.xid_events(1.0)
        waited = time.monotonic() - started
        await source.aclose()
    assert [(e.xid, e.gpu_index, e.uuid) for e in events] == [(79, 5, spec.uuid(5))]
    assert 0.9 < waited < 5  # the whole window, give or take a loose bound


async def test_xids_between_windows_are_kept(machine: Machine) -> None:
    fake = machine(init=False, gpus={"count": 3})
    source = NvmlGpuSource(poll_ms=20)
    assert await source.xid_events(0) == []  # registers for XIDs on every GPU
    fake.emit_xid(2, 94)
    fake.emit_xid(0, 31)
    events = await source.xid_events(0)
    assert [(e.xid, e.gpu_index, e.uuid) for e in events] == [
        (94, 2, fake.spec.uuid(2)), (31, 0, fake.spec.uuid(0))]
    assert await source.xid_events(0) == []  # each XID is returned once
    await source.aclose()


async def watch_one(source: NvmlGpuSource, into: list[XidEvent]) -> None:
    """Watch until one XID arrives, and keep it."""
    async for event in source.watch_xids():
        into.append(event)
        return


async def test_watch_and_windows_both_see_every_xid(machine: Machine) -> None:
    fake = machine(init=False, gpus={"count": 2})
    source = NvmlGpuSource(poll_ms=20)
    await source.xid_events(0)
    watched: list[XidEvent] = []

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_one, source, watched)
            await anyio.sleep(0.05)
            fake.emit_xid(1, 79)
    assert [(e.xid, e.gpu_index) for e in watched] == [(79, 1)]
    assert [(e.xid, e.gpu_index) for e in await source.xid_events(0)] == [(79, 1)]
    await source.aclose()


async def test_no_driver_gives_empty_windows(machine: Machine) -> None:
    machine(init=False, driver_present=False)
    source = NvmlGpuSource(poll_ms=20)
    with anyio.fail_after(5):
        assert await source.xid_events(0.1) == []
    assert (await source.snapshot()).driver_error == "NVIDIA driver not found"
    await source.aclose()


async def test_cancelled_window_returns_promptly(machine: Machine) -> None:
    machine(init=False, gpus={"count": 1})
    source = NvmlGpuSource(poll_ms=100)
    started = time.monotonic()
    with anyio.move_on_after(0.1):
        await source.xid_events(30)
    assert time.monotonic() - started < 2  # at most one short NVML wait after cancel
    await source.aclose()


async def test_a_read_does_not_queue_behind_an_xid_wait(machine: Machine) -> None:
    fake = machine(init=False, gpus={"count": 2})
    source = NvmlGpuSource(poll_ms=30_000)
    await source.xid_events(0)  # registered: the watch below blocks in a long wait
    watched: list[XidEvent] = []

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_one, source, watched)
            await anyio.sleep(0.05)
            assert len((await source.snapshot()).gpus) == 2  # while the wait is in flight
            fake.emit_xid(0, 79)  # ends the watch
    assert [(e.xid, e.gpu_index) for e in watched] == [(79, 0)]
    await source.aclose()


async def test_a_window_collects_from_a_running_watch(machine: Machine) -> None:
    fake = machine(init=False, gpus={"count": 2})
    source = NvmlGpuSource(poll_ms=30_000)
    await source.xid_events(0)
    watched: list[XidEvent] = []
    collected: list[XidEvent] = []

    async def listen() -> None:
        collected.extend(await source.xid_events(0.3))

    with anyio.fail_after(5):  # the window does not wait out the watch's 30 s wait
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_one, source, watched)
            await anyio.sleep(0.05)
            assert await source.xid_events(0.2) == []  # ends on time, nothing came
            tg.start_soon(listen)
            await anyio.sleep(0.05)
            fake.emit_xid(1, 48)  # received by the watch, handed to the window
    assert [(e.xid, e.gpu_index) for e in collected] == [(48, 1)]
    assert [(e.xid, e.gpu_index) for e in watched] == [(48, 1)]
    await source.aclose()


class GatedReader:
    """A reader whose first read waits for the test's word; each read is numbered."""

    def __init__(self) -> None:
        self.reads = 0
        self.first_may_end = threading.Event()

    def read(self) -> NodeSnapshot:
        self.reads += 1
        number = self.reads
        if number == 1:
            self.first_may_end.wait(5)
        return NodeSnapshot(driver_version=str(number))

    def close(self) -> None:
        pass


async def test_a_read_begun_before_new_round_does_not_serve_the_new_round() -> None:
    reader = GatedReader()
    source = NvmlGpuSource(reader)  # type: ignore[arg-type]
    old: list[object] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_append, source, old)
        await anyio.sleep(0.05)  # the old round's read is in flight
        source.new_round()
        reader.first_may_end.set()
        new = await source.snapshot()
    assert [s.driver_version for s in old] == ["1"]  # type: ignore[attr-defined]
    assert new.driver_version == "2"
