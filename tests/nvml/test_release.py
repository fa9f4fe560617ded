"""Letting go of the GPUs (NvmlReader.release, the one gate) over the fake NVML
library, judged by what the library says the process holds (sessions, event sets,
nvmlInit calls), never by the reader's own word:

- a release ends the session and frees the event set; until `resume` nothing opens
  NVML again: the pass says why (its driver error), an XID wait raises
  XidUnavailable with it, the busy test answers it, a hold is refused;
- `resume` opens NVML again with a new XID event set, and XIDs reach it;
- a reader that starts released never opens NVML before `resume`;
- a hold (a measurement touching the GPUs) keeps the session until it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from checks.nvml_reader import NvmlReader, XidUnavailable
from healthd.sim.fakenvml import FakeNvml, install
from healthd.sim.holders import Sessions
from healthd.sim.machine import load_machine_spec
from tests.agent.harness import eventually

REASON = "NVML released for a GPU reset"


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    with install(load_machine_spec("healthy-8xh100")) as fake:
        yield fake


def test_a_release_ends_the_session_and_nothing_opens_nvml_until_resumed(
        fake: FakeNvml) -> None:
    reader = NvmlReader()
    assert reader.read().gpus and reader.wait_xid(0) is None
    assert fake.sessions() == Sessions(open=1, inits=1, event_sets=1)

    reader.release(REASON)
    assert not fake.sessions().holding
    assert reader.read().driver_error == REASON
    with pytest.raises(XidUnavailable, match=REASON):
        reader.wait_xid(0)
    assert reader.activity(fake.spec.pci_bus_id(3)).problem == REASON
    with reader.hold() as refused:
        assert refused == REASON
    assert fake.sessions() == Sessions(open=0, inits=1, event_sets=0)  # no nvmlInit since

    reader.resume()
    reader.listen()
    assert fake.sessions() == Sessions(open=1, inits=2, event_sets=1)
    fake.emit_xid(3, 79)
    event = reader.wait_xid(1000)
    assert event is not None and (event.xid, event.gpu_index) == (79, 3)
    assert reader.read().driver_error == ""
    reader.close()


def test_a_reader_that_starts_released_never_opens_nvml(fake: FakeNvml) -> None:
    reader = NvmlReader(released=REASON)
    assert reader.read().driver_error == REASON
    with pytest.raises(XidUnavailable, match=REASON):
        reader.wait_xid(0)
    reader.listen()
    reader.release("another reason")
    assert fake.sessions() == Sessions()  # not one nvmlInit
    reader.resume()
    assert reader.read().gpus
    assert fake.sessions().open == 1
    reader.close()


@pytest.mark.anyio
async def test_a_hold_keeps_the_session_until_the_measurement_ends(fake: FakeNvml) -> None:
    reader = NvmlReader()
    reader.read()
    with reader.hold() as refused:
        assert refused == ""
        releasing = threading.Thread(target=reader.release, args=(REASON,))
        releasing.start()
        await eventually(lambda: reader.released == REASON, what="the release under way")
        assert fake.sessions().open == 1  # the release waits for the copy in flight
        with reader.hold() as second:
            assert second == REASON  # and no new measurement starts meanwhile
    releasing.join(timeout=10)
    assert not releasing.is_alive()
    assert not fake.sessions().holding

