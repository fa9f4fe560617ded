"""The `rdma` check over a fake /sys/class/infiniband tree: a port down or slower than
its siblings, error counters that grow (after a baseline round), the netdev and the
network it serves; no devices SKIPPED, a recording without them "not recorded"."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.base import Attachment, CheckContext, Severity
from checks.catalog import Catalog
from checks.probes import Probes
from checks.rdma import RdmaCheck, SysfsRdmaReader, parse_rate
from healthd.sim.machine import RdmaSpec
from healthd.sim.rdma import NotRecordedRdma, SimRdma

from .gpufakes import run

pytestmark = pytest.mark.anyio


def tree(tmp_path: Path, devices: int = 4) -> SimRdma:
    return SimRdma(tmp_path / "infiniband", RdmaSpec(devices=devices, rate_gbps=400))


def on(sim: SimRdma, params: dict[str, object] | None = None) -> RdmaCheck:
    """The check reading the fake sysfs tree."""
    return RdmaCheck(params, probes=Probes(rdma=SysfsRdmaReader(sim.root)))


def context(**fields: object) -> CheckContext:
    return CheckContext(catalog=Catalog(), **fields)  # type: ignore[arg-type]


def codes(result: object) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in result.findings:  # type: ignore[attr-defined]
        out.setdefault(f.entity.name, []).append(f.code)
    return out


def test_sysfs_values_are_read_as_the_kernel_writes_them() -> None:
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("") is None and parse_rate("garbage") is None


async def test_a_down_port_is_err_and_named_with_its_netdev_and_network(tmp_path: Path) -> None:
    sim = tree(tmp_path)
    sim.set_port("mlx5_2", state="DOWN", phys_state="Disabled")
    attachments = [Attachment("roce-a", "net3")]
    result = await run(on(sim), context(attachments=attachments))
    assert codes(result) == {"mlx5_2/1": ["RDMA_PORT_DOWN"]}
    (down,) = result.findings
    assert down.severity is Severity.ERR and down.entity.network == "roce-a"
    assert down.message == "RDMA port mlx5_2/1 (net3) is down: state DOWN, physical state Disabled"


async def test_a_port_slower_than_its_siblings_is_degraded(tmp_path: Path) -> None:
    sim = tree(tmp_path)
    sim.set_port("mlx5_1", rate_gbps=200)
    result = await run(on(sim), context())
    assert codes(result) == {"mlx5_1/1": ["RDMA_RATE_LOW"]}
    configured = await run(on(sim, {"expected_rate_gbps": 800}), context())
    assert set(codes(configured)) == {"mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1"}


async def test_error_counters_that_grow_after_the_baseline(tmp_path: Path) -> None:
    sim = tree(tmp_path)
    sim.set_port("mlx5_0", counters={"symbol_error": 10, "link_downed": 1})
    check = on(sim)
    assert (await run(check, context())).findings == ()  # baseline, old errors
    sim.set_port("mlx5_0", counters={"symbol_error": 25, "link_downed": 2})
    grown = await run(check, context())
    assert codes(grown) == {"mlx5_0/1": ["RDMA_ERRORS"]}
    assert "link_downed +1, symbol_error +15" in grown.findings[0].message
    assert (await run(check, context())).findings == ()  # steady again


async def test_no_devices_skipped_not_recorded_skipped(tmp_path: Path) -> None:
    empty = await run(RdmaCheck({"sysfs_root": str(tmp_path / "none")}),
                      CheckContext(catalog=Catalog()))
    assert (empty.status, empty.reason) == (Severity.SKIPPED, "no RDMA devices")
    replay = await run(RdmaCheck(probes=Probes(rdma=NotRecordedRdma())), context())
    assert (replay.status, replay.reason) == (Severity.SKIPPED, "not recorded")
