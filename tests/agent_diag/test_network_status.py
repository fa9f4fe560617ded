"""Peers' networks from Multus `network-status`: both spellings of the annotation
(Multus `network-status`, OpenShift `networks-status`), the pod network told apart
by `default: true` (or `eth0` when nothing is marked), entries without `ips`,
IPv6, colliding short names; and for garbage, wrong shapes and oversized values:
the peer is still probed on its pod network, one clear log line, never a crash.
Peers as the controller reads them (healthd.blame.agents.member_of); through its
real watch of the agent pods over the API emulator for the log line."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from checks.base import Attachment
from healthd.blame.agents import member_of
from healthd.blame.network_status import MAX_ANNOTATION_BYTES, network_status, parse
from healthd.blame.peersets import Member
from healthd.controller.peering import AgentPods
from healthd.kube.watching import WatchEvent

from .test_peers import agent_pod

MULTUS = "k8s.v1.cni.cncf.io/network-status"
OPENSHIFT = "k8s.v1.cni.cncf.io/networks-status"

POD_ENTRY = {"name": "k8s-pod-network", "interface": "eth0", "ips": ["10.0.0.2"],
             "default": True}


def annotated(name: str, node: str, ip: str, value: Any, key: str = MULTUS) -> dict[str, Any]:
    obj = agent_pod(name, node, ip)
    text = value if isinstance(value, str) else json.dumps(value)
    obj["metadata"]["annotations"] = {key: text}
    return obj


def net(name: str, interface: str, *ips: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "interface": interface, "ips": list(ips), **extra}


@pytest.mark.parametrize("key", [MULTUS, OPENSHIFT])
def test_both_spellings_give_the_secondary_networks(key: str) -> None:
    value = [POD_ENTRY, net("healthd-system/net1", "net1", "192.168.1.2"),
             net("healthd-system/net2", "net2", "fd00:2::2")]
    peer = member_of(annotated("a", "n2", "10.0.0.2", value, key))
    assert peer == Member("n2", ("10.0.0.2",), {"net1": ("192.168.1.2",),
                                                "net2": ("fd00:2::2",)})


def test_default_true_marks_the_pod_network_whatever_its_interface() -> None:
    value = [net("ovn-kubernetes", "ovn0", "10.0.0.2", default=True),
             net("macvlan", "eth0", "192.168.5.2")]
    assert parse(json.dumps(value)) == (Attachment("macvlan", "eth0", ("192.168.5.2",)),)


def test_without_a_default_mark_eth0_is_the_pod_network() -> None:
    value = [net("cbr0", "eth0", "10.0.0.2"), net("net1", "net1", "192.168.1.2")]
    assert parse(json.dumps(value)) == (Attachment("net1", "net1", ("192.168.1.2",)),)


def test_missing_ips_names_the_interface_but_gives_ping_nothing() -> None:
    value = [POD_ENTRY, {"name": "sriov/net1", "interface": "net1"}]
    status = network_status(annotated("a", "n2", "10.0.0.2", value))
    assert status.attachments == (Attachment("net1", "net1", ()),)
    assert status.addresses() == {}
    assert member_of(annotated("a", "n2", "10.0.0.2", value)).networks == {}


def test_ipv6_addresses_are_kept_and_normalised_and_bad_ones_dropped() -> None:
    value = [POD_ENTRY, net("net1", "net1", "FD00:0:0:1::0002", "not-an-ip", "192.168.1.2")]
    assert parse(json.dumps(value))[0].addresses == ("fd00:0:0:1::2", "192.168.1.2")


def test_colliding_short_names_keep_their_namespaces() -> None:
    value = [POD_ENTRY, net("team-a/net1", "net1", "192.168.1.2"),
             net("team-b/net1", "net2", "192.168.2.2")]
    assert [a.network for a in parse(json.dumps(value))] == ["team-a/net1", "team-b/net1"]


GARBAGE = {
    "not json": "{{{",
    "a JSON object": json.dumps({"name": "net1"}),
    "a list of strings": json.dumps(["net1"]),
    "oversized": json.dumps([POD_ENTRY] + [net(f"n{i}", "net1", "192.168.1.2")
                                           for i in range(MAX_ANNOTATION_BYTES // 40)]),
    "bad entry fields": json.dumps([POD_ENTRY, {"name": 7, "interface": ["x"], "ips": "1"}]),
    "nested": "[" * 30_000 + "]" * 30_000,  # once a RecursionError out of the decoder
}


@pytest.mark.parametrize("case", GARBAGE)
def test_garbage_leaves_the_pod_network_only(case: str) -> None:
    peer = member_of(annotated("a", "n2", "10.0.0.2", GARBAGE[case]))
    assert peer == Member("n2", ("10.0.0.2",), {})


def test_garbage_is_logged_once_per_pod_and_value(caplog: pytest.LogCaptureFixture) -> None:
    """The controller's watch replays a pod on every change of it: the same bad value
    is said once."""
    pods = AgentPods()
    good = annotated("good", "n3", "10.0.0.3", [POD_ENTRY, net("net1", "net1", "192.168.1.3")],
                     OPENSHIFT)
    with caplog.at_level(logging.WARNING, logger="healthd.blame.network_status"):
        for _ in range(3):
            pods.apply(WatchEvent("MODIFIED", annotated("bad", "n2", "10.0.0.2", "[{oops")))
        pods.apply(WatchEvent("ADDED", good))
    assert sorted(pods.members(), key=lambda m: m.node) == [
        Member("n2", ("10.0.0.2",), {}), Member("n3", ("10.0.0.3",), {"net1": ("192.168.1.3",)})]
    said = [r.getMessage() for r in caplog.records if "network-status" in r.getMessage()]
    assert len(said) == 1
    assert "pod healthd-system/bad" in said[0] and "pod network only" in said[0]
