"""Two networks in real network namespaces: three hosts, each on the pod network
(`eth0`) and a secondary network (`net1`), every network a bridge (tests.network.
netlab.Fabric). The ping check runs inside each host's namespace (a subprocess under
`ip netns exec`), as that host's agent would, and the controller's blame judges what
they would publish; the `nic` check reads each host's links over netlink.

- everything fine: no finding anywhere, nobody blamed, no partition;
- one host's net1 unplugged (no carrier): the others miss it on net1 only, it is
  isolated on net1, the blame names it on net1 and nowhere else, and its nic check
  says NIC_DOWN (no carrier) on net1; the pod network is untouched;
- net1 blackholed or its echo dropped by nftables on one host: per-network
  reachability says so on net1 only;
- an MTU raised on one host's net1: NIC_MTU_MISMATCH on that host only;
- a link unplugged and replugged between two rounds: NIC_FLAPPING (carrier changes);
- each host's RDMA NIC behind net1 (a fake /sys/class/infiniband tree whose port
  follows net1's carrier, as a RoCE port follows its link): unplugged, the `rdma`
  check says RDMA_PORT_DOWN on that host's port, attributed to net1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from checks.base import Attachment, CheckContext, CheckResult, run_check
from checks.catalog import Catalog
from checks.nic import NetlinkReader, NicCheck
from checks.probes import Probes
from checks.rdma import RdmaCheck, SysfsRdmaReader
from healthd.blame.networks import Assessment, assess_networks, ping_rows
from healthd.kube.conventions import Keys
from healthd.sim.machine import RdmaPortSpec, RdmaSpec
from healthd.sim.rdma import SimRdma
from tests.conftest import require_binary
from tests.network.netlab import INTERFACES, Fabric, FabricHost

pytestmark = [pytest.mark.root, pytest.mark.anyio]

HOSTS = ("h0", "h1", "h2")
FAST = {"count": 2, "timeout_s": 0.3, "interval_s": 0.05}
KEYS = Keys()


@pytest.fixture
async def fabric(anyio_backend: str) -> AsyncIterator[Fabric]:
    lab = Fabric()
    try:
        await lab.start(HOSTS)
        yield lab
    finally:
        await lab.close()


async def ping_from(fabric: Fabric, host: FabricHost) -> dict[str, Any]:
    """The ping check as run by `host`'s agent, in its namespace."""
    peers = [{"name": h.name, "addresses": list(h.peer().addresses),
              "networks": {n: list(a) for n, a in h.peer().networks.items()}}
             for h in fabric.hosts.values() if h.name != host.name]
    given = json.dumps({"node": host.name, "peers": peers, "params": FAST})
    cmd = ["ip", "netns", "exec", host.netns, sys.executable, "-m",
           "tests.network.ping_in_netns"]
    done = await anyio.run_process(cmd, input=given.encode(), check=True)
    return dict(json.loads(done.stdout))


async def fleet_round(fabric: Fabric) -> tuple[dict[str, dict[str, Any]], dict[str, Assessment]]:
    """Every host's ping round, and the controller's blame over what they publish."""
    seen = {h.name: await ping_from(fabric, h) for h in fabric.hosts.values()}
    nodes = [{"metadata": {"name": name, "annotations": {
        KEYS.health: json.dumps({"ping": got["ping"]})}}} for name, got in seen.items()]
    rows: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for network, row in ping_rows(node, KEYS).items():
            rows.setdefault(network, {})[node["metadata"]["name"]] = row
    return seen, assess_networks(rows)


async def nic_of(host: FabricHost, **params: Any) -> CheckResult:
    ctx = CheckContext(catalog=Catalog(), node_name=host.name,
                       attachments=[Attachment("net1", INTERFACES["net1"])])
    check = NicCheck(params, probes=Probes(links=NetlinkReader(netns=host.netns)))
    return await run_check(check, ctx, timeout_s=10)


async def rdma_of(host: FabricHost, root: Path) -> CheckResult:
    """The rdma check on `host`, whose one RoCE port (mlx5_0, netdev net1) is up
    exactly when net1 has a carrier."""
    link = (await NetlinkReader(netns=host.netns).read([INTERFACES["net1"]]))[
        INTERFACES["net1"]]
    port = RdmaPortSpec(device="mlx5_0", netdev=INTERFACES["net1"],
                        state="ACTIVE" if link.up else "DOWN",
                        phys_state="LinkUp" if link.up else "Disabled")
    tree = SimRdma(root / host.name, RdmaSpec(ports=[port]))
    ctx = CheckContext(catalog=Catalog(), node_name=host.name,
                       attachments=[Attachment("net1", INTERFACES["net1"])])
    check = RdmaCheck(probes=Probes(rdma=SysfsRdmaReader(tree.root)))
    return await run_check(check, ctx, timeout_s=10)


def findings(result: CheckResult) -> list[tuple[str, str]]:
    return [(f.code, f.entity.label) for f in result.findings]


async def test_everything_fine_no_finding_no_blame(fabric: Fabric) -> None:
    seen, found = await fleet_round(fabric)
    for name, got in seen.items():
        assert got["status"] == "PASS", (name, got)
        assert got["findings"] == []
        others = sorted(h for h in HOSTS if h != name)
        assert got["ping"]["networks"] == {"net1": {"isolated": False, "unreached": [],
                                                    "reached": others}}
    assert {n: (dict(a.blamed), a.partitioned) for n, a in found.items()} == {
        "pod": ({}, False), "net1": ({}, False)}
    for host in fabric.hosts.values():
        nic = await nic_of(host, expect={"net1": {"mtu": 1500}})
        assert nic.status.value == "PASS" and nic.findings == ()


async def test_unplugged_net1_blames_that_host_on_net1_only(fabric: Fabric) -> None:
    await fabric.unplug("h1", "net1")
    seen, found = await fleet_round(fabric)
    for other in ("h0", "h2"):
        assert seen[other]["findings"] == [["PEER_UNREACHABLE", "peer/h1@net1"]]
    assert seen["h1"]["findings"] == [["NETWORK_ISOLATED", "network/net1"]]
    assert list(found["net1"].blamed) == ["h1"]
    assert dict(found["pod"].blamed) == {} and not found["pod"].partitioned
    assert not found["net1"].partitioned

    nic = await nic_of(fabric.hosts["h1"])
    assert findings(nic) == [("NIC_DOWN", "nic/net1")]
    assert "no carrier" in nic.findings[0].message and nic.status.value == "ERR"
    assert (await nic_of(fabric.hosts["h0"])).findings == ()


async def test_blackholed_net1_is_unreachable_on_net1_only(fabric: Fabric) -> None:
    await fabric.blackhole("h2", "net1")
    seen, found = await fleet_round(fabric)
    assert seen["h0"]["findings"] == [["PEER_UNREACHABLE", "peer/h2@net1"]]
    assert seen["h0"]["ping"]["unreached"] == []
    assert list(found["net1"].blamed) == ["h2"] and dict(found["pod"].blamed) == {}


async def test_nftables_drop_on_net1_is_unreachable_on_net1_only(fabric: Fabric) -> None:
    await fabric.drop_echo("h0", "net1", require_binary("nft"))
    seen, found = await fleet_round(fabric)
    assert seen["h1"]["findings"] == [["PEER_UNREACHABLE", "peer/h0@net1"]]
    assert seen["h1"]["ping"]["unreached"] == []
    assert list(found["net1"].blamed) == ["h0"] and dict(found["pod"].blamed) == {}


async def test_raised_mtu_is_a_mismatch_on_that_host_only(fabric: Fabric) -> None:
    await fabric.set_mtu("h2", "net1", 9000)
    expect = {"expect": {"net1": {"mtu": 1500}}}
    results = {h.name: await nic_of(h, **expect) for h in fabric.hosts.values()}
    assert findings(results["h2"]) == [("NIC_MTU_MISMATCH", "nic/net1")]
    assert results["h2"].findings[0].values["mtu"] == 9000
    assert results["h0"].findings == () and results["h1"].findings == ()


async def test_carrier_lost_and_back_between_rounds_is_flapping(fabric: Fabric) -> None:
    host = fabric.hosts["h0"]
    # Packets sent while the carrier was gone are dropped (the flap's own drops, a
    # high rate over the milliseconds between these two rounds): the drop rate is
    # not what this test is about.
    check = NicCheck({"max_drops_per_s": 1e9},
                     probes=Probes(links=NetlinkReader(netns=host.netns)))
    ctx = CheckContext(catalog=Catalog(), node_name=host.name,
                       attachments=[Attachment("net1", INTERFACES["net1"])])
    assert (await run_check(check, ctx, timeout_s=10)).findings == ()  # baseline
    await fabric.unplug("h0", "net1")
    await fabric.replug("h0", "net1")
    result = await run_check(check, ctx, timeout_s=10)
    assert findings(result) == [("NIC_FLAPPING", "nic/net1")]
    assert result.findings[0].values["carrier_changes_delta"] >= 2


async def test_rdma_port_behind_an_unplugged_net1_is_down_on_net1(fabric: Fabric,
                                                                  tmp_path: Path) -> None:
    assert (await rdma_of(fabric.hosts["h1"], tmp_path / "before")).findings == ()
    await fabric.unplug("h1", "net1")
    down = await rdma_of(fabric.hosts["h1"], tmp_path / "after")
    assert [(f.code, f.entity.name, f.entity.network) for f in down.findings] == [
        ("RDMA_PORT_DOWN", "mlx5_0/1", "net1")]
    assert (await rdma_of(fabric.hosts["h0"], tmp_path / "after")).findings == ()
