"""The `nic` check's judgement over link reads: a down link on a training network
is ERR, on a non-training one WARN; a missing interface; MTU against the network's
expectation; speed below the expected minimum (and none when the driver gives no
speed); carrier-change and error/drop growth judged between rounds only (first
round = baseline, counter resets ignored); networks filtered by config; no
attachments = SKIPPED; a netlink failure = UNKNOWN. The link reader is the one
fake here (the netns tests read real links); `read_speed` reads a sysfs tree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checks.base import Attachment, CheckContext, CheckResult, Severity, run_check
from checks.catalog import Catalog
from checks.nic import NicCheck, read_speed
from checks.probes import LinkState, Probes

pytestmark = pytest.mark.anyio

NET1 = Attachment("net1", "net1", ("192.168.1.2",))
NET2 = Attachment("net2", "net2", ("192.168.2.2",))
ZERO = {"rx_errors": 0, "tx_errors": 0, "rx_dropped": 0, "tx_dropped": 0}


def healthy(interface: str = "net1", **changes: Any) -> LinkState:
    link = LinkState(interface, admin_up=True, operstate="UP", carrier=True,
                     carrier_changes=2, mtu=9000, counters=ZERO, speed_mbps=400000)
    return replace(link, **changes)


class Links:
    """What netlink would say, changeable between rounds."""

    def __init__(self, *links: LinkState) -> None:
        self.links = {link.interface: link for link in links}
        self.fail: OSError | None = None

    async def read(self, interfaces: Sequence[str]) -> Mapping[str, LinkState]:
        if self.fail is not None:
            raise self.fail
        return {i: self.links[i] for i in interfaces if i in self.links}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def nic(links: Links, params: dict[str, Any] | None = None, **kwargs: Any) -> NicCheck:
    """The check reading `links` instead of netlink."""
    return NicCheck(params, probes=Probes(links=links), **kwargs)


async def run(check: NicCheck, *attachments: Attachment) -> CheckResult:
    ctx = CheckContext(catalog=Catalog(), node_name="n1", attachments=attachments or (NET1,))
    return await run_check(check, ctx, timeout_s=5)


def codes(result: CheckResult) -> list[tuple[str, str]]:
    return [(f.code, f.entity.label) for f in result.findings]


async def test_healthy_links_pass_with_values() -> None:
    result = await run(nic(Links(healthy()),
                           {"expect": {"net1": {"mtu": 9000, "min_speed_mbps": 200000}}}))
    assert result.status is Severity.PASS and result.findings == ()
    [entity] = result.entities
    assert entity.entity.network == "net1" and entity.values["speed_mbps"] == 400000


@pytest.mark.parametrize(("change", "why"), [
    ({"carrier": False, "operstate": "LOWERLAYERDOWN"}, "no carrier"),
    ({"admin_up": False, "operstate": "DOWN"}, "administratively down"),
    ({"operstate": "DORMANT"}, "operstate DORMANT"),
])
async def test_down_link_on_a_training_network_is_err(change: dict[str, Any], why: str) -> None:
    result = await run(nic(Links(healthy(**change))))
    assert codes(result) == [("NIC_DOWN", "nic/net1")]
    assert result.status is Severity.ERR and why in result.findings[0].message


async def test_down_link_on_a_non_training_network_is_warn() -> None:
    result = await run(nic(Links(healthy(carrier=False)),
                           {"expect": {"net1": {"training": False}}}))
    assert codes(result) == [("NIC_DOWN_AUXILIARY", "nic/net1")]
    assert result.status is Severity.WARN


async def test_missing_interface_is_err_and_names_it() -> None:
    result = await run(nic(Links(healthy())), NET1, NET2)
    assert codes(result) == [("NIC_MISSING", "nic/net2")]
    assert result.status is Severity.ERR and "net2 (net2)" in result.findings[0].message


async def test_mtu_mismatch_only_when_an_mtu_is_expected() -> None:
    assert (await run(nic(Links(healthy(mtu=1500))))).findings == ()
    result = await run(nic(Links(healthy(mtu=1500)), {"expect": {"net1": {"mtu": 9000}}}))
    assert codes(result) == [("NIC_MTU_MISMATCH", "nic/net1")]
    assert result.status is Severity.WARN


async def test_speed_below_expected_is_warn_and_unknown_speed_is_not_judged() -> None:
    links = Links(healthy(speed_mbps=100000))
    check = nic(links, {"expect": {"net1": {"min_speed_mbps": 200000}}})
    assert codes(await run(check)) == [("NIC_SPEED_LOW", "nic/net1")]
    links.links["net1"] = healthy(speed_mbps=None)
    assert (await run(check)).findings == ()


async def test_growth_is_judged_between_rounds_only() -> None:
    clock, links = Clock(), Links(healthy(carrier_changes=10))
    check = nic(links, {"max_errors_per_s": 0.0, "max_drops_per_s": 1.0}, clock=clock)
    assert (await run(check)).findings == ()  # the baseline
    clock.now += 60
    links.links["net1"] = healthy(carrier_changes=14,
                                  counters={**ZERO, "rx_errors": 3, "rx_dropped": 30})
    result = await run(check)
    assert codes(result) == [("NIC_FLAPPING", "nic/net1"), ("NIC_ERRORS", "nic/net1")]
    assert result.findings[0].values["carrier_changes_delta"] == 4
    assert result.findings[1].values["errors_per_s"] == 0.05
    assert result.status is Severity.WARN
    clock.now += 60  # nothing grew since: quiet again
    assert (await run(check)).findings == ()


async def test_drops_below_the_rate_and_counter_resets_are_quiet() -> None:
    clock, links = Clock(), Links(healthy(counters={**ZERO, "tx_dropped": 1000}))
    check = nic(links, {"max_drops_per_s": 10.0}, clock=clock)
    await run(check)
    clock.now += 10
    links.links["net1"] = healthy(counters={**ZERO, "tx_dropped": 1050})  # 5/s
    assert (await run(check)).findings == ()
    clock.now += 10
    links.links["net1"] = healthy(counters=ZERO)  # driver reloaded
    assert (await run(check)).findings == ()


async def test_only_the_configured_networks_are_checked() -> None:
    result = await run(nic(Links(healthy(carrier=False), healthy("net2")), {"networks": ["net2"]}),
                       NET1, NET2)
    assert [e.entity.label for e in result.entities] == ["nic/net2"]
    assert result.findings == ()


async def test_no_secondary_interface_is_skipped() -> None:
    ctx = CheckContext(catalog=Catalog(), node_name="n1")
    result = await run_check(NicCheck(), ctx, timeout_s=5)
    assert result.status is Severity.SKIPPED


async def test_netlink_failure_is_unknown_with_the_reason() -> None:
    links = Links(healthy())
    links.fail = PermissionError(13, "Permission denied")
    result = await run(nic(links))
    assert result.status is Severity.UNKNOWN and "netlink" in result.reason


@pytest.mark.parametrize(("text", "speed"), [("100000\n", 100000), ("-1\n", None),
                                              ("garbage", None), (None, None)])
def test_read_speed_from_sysfs(tmp_path: Path, text: str | None, speed: int | None) -> None:
    path = tmp_path / "net1" / "speed"
    if text is not None:
        path.parent.mkdir()
        path.write_text(text)
    assert read_speed(path) == speed


async def test_an_attachment_without_an_interface_name_is_not_read() -> None:
    result = await run(nic(Links(healthy())), NET1, Attachment("net2", ""))
    assert [e.entity.label for e in result.entities] == ["nic/net1"]
    assert result.findings == ()
