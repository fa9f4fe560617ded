"""`healthd.blame.peersets`: the bounded, rotating peer sets. What an operator relies on:
each node is probed by exactly k others (so a dead node always has k witnesses), no
agent probes more than k per network whatever the fleet's size, the sets change from
one epoch to the next, anyone with the names recomputes the same sets, a small fleet
pings everyone, the fleet's blame marks a peer only where it is probed and blamed,
and the annotation reads back as written."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.base import POD_NETWORK, Peer
from healthd.blame.peersets import (
    BadPeerSet,
    Member,
    PeerSet,
    assign,
    decode,
    epoch_of,
    peer_sets,
)

NAMES = st.lists(st.from_regex(r"gpu-[a-z0-9]{1,6}", fullmatch=True), unique=True,
                 min_size=0, max_size=80)


@given(NAMES, st.integers(1, 20), st.integers(0, 10**6))
def test_every_node_probes_and_is_probed_by_exactly_k_others(
        names: list[str], k: int, epoch: int) -> None:
    sets = assign(names, k, epoch)
    expected = min(k, max(len(names) - 1, 0))
    assert set(sets) == set(names)
    probed_by = Counter(p for peers in sets.values() for p in peers)
    for node, peers in sets.items():
        assert node not in peers
        assert len(set(peers)) == len(peers) == expected
        assert probed_by[node] == expected


def test_load_is_bounded_by_k_not_by_the_fleet() -> None:
    fleet = [f"gpu-{i:05d}" for i in range(10_000)]
    sets = assign(fleet, 16, epoch=7)
    assert {len(p) for p in sets.values()} == {16}


def test_a_small_fleet_pings_everyone_else() -> None:
    sets = assign(["a", "b", "c"], 16, epoch=1)
    assert {n: set(p) for n, p in sets.items()} == {
        "a": {"b", "c"}, "b": {"a", "c"}, "c": {"a", "b"}}
    assert assign(["a"], 16, 1) == {"a": ()}
    assert assign([], 16, 1) == {}


def test_the_sets_rotate_between_epochs_and_differ_per_network() -> None:
    fleet = [f"gpu-{i:03d}" for i in range(50)]
    now, later = assign(fleet, 16, 100), assign(fleet, 16, 101)
    changed = sum(set(now[n]) != set(later[n]) for n in fleet)
    assert changed == len(fleet)
    assert assign(fleet, 16, 100, "net1") != now


def test_same_names_same_epoch_same_sets_whatever_the_order() -> None:
    fleet = [f"gpu-{i:03d}" for i in range(50)]
    assert assign(fleet, 16, 5) == assign(list(reversed(fleet)), 16, 5)


def test_a_node_joining_moves_only_the_k_nodes_before_it() -> None:
    fleet = [f"gpu-{i:03d}" for i in range(200)]
    before = assign(fleet, 16, 9)
    after = assign([*fleet, "gpu-new"], 16, 9)
    moved = [n for n in fleet if before[n] != after[n]]
    assert len(moved) == 16


def test_epoch_is_the_interval_number() -> None:
    assert epoch_of(7199.9, 3600) == 1
    assert epoch_of(7200.0, 3600) == 2


def members(count: int, *, net1: bool = True) -> list[Member]:
    return [Member(f"gpu-{i:02d}", (f"10.0.0.{i}",),
                   {"net1": (f"192.168.1.{i}",)} if net1 and i % 2 == 0 else {})
            for i in range(count)]


def test_peer_sets_probe_each_network_only_among_its_members() -> None:
    sets = peer_sets(members(40), 4, epoch=3)
    net1 = {m.node for m in members(40) if m.networks}
    for node, peer_set in sets.items():
        assert len(peer_set.probed(POD_NETWORK)) == 4
        assert peer_set.probed("net1") <= net1
        assert len(peer_set.probed("net1")) == (4 if node in net1 else 0)
        for peer in peer_set.peers:
            assert peer.networks.get("net1", ("192.168.1.",))[0].startswith("192.168.1.")


def test_a_blamed_peer_is_marked_where_it_is_probed_and_blamed() -> None:
    fleet = members(6)  # gpu-00, 02, 04 on net1 too
    sets = peer_sets(fleet, 16, epoch=3, blamed={("gpu-02", "net1"), ("gpu-03", "net1")})
    for node, peer_set in sets.items():
        marks = {p.name: p.blamed for p in peer_set.peers if p.blamed}
        assert marks == ({"gpu-02": {"net1"}} if node in ("gpu-00", "gpu-04") else {}), node
    unblamed = peer_sets(fleet, 16, epoch=3)
    assert all(not p.blamed for s in unblamed.values() for p in s.peers)


def test_the_annotation_reads_back_as_written() -> None:
    peer_set = PeerSet(12, (Peer("a", ("10.0.0.1", "fd00::1"), {"net1": ("192.168.1.1",)}),
                            Peer("b", (), {"net1": ("192.168.1.2",)}, frozenset({"net1"}))))
    assert decode(peer_set.encode()) == peer_set
    assert peer_set.probed() == {"a"}
    assert peer_set.probed("net1") == {"a", "b"}


@pytest.mark.parametrize("raw", [None, "", "[]", '{"epoch": "1", "peers": []}',
                                 '{"epoch": 1, "peers": [{"addresses": []}]}',
                                 '{"epoch": 1, "peers": [{"node": "a", "addresses": [1]}]}',
                                 '{"epoch": 1, "peers": [{"node": "a", "networks": []}]}',
                                 '{"epoch": 1, "peers": [{"node": "a", "blamed": "net1"}]}',
                                 "x" * 300_000])
def test_anything_else_is_refused_with_a_reason(raw: object) -> None:
    with pytest.raises(BadPeerSet):
        decode(raw)
