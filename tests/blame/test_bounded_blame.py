"""Network blame from partial views: 50 simulated agents, each probing 16 peers per
network (pod network and net1) from the rotating sets the controller publishes, over
two hours of five-minute rounds, the sets rotating every half hour
(tests/blame/rounds.py: the real ping check, verdict machine and annotation; ICMP
simulated). What an operator sees:

- a healthy fleet: nobody blamed, no partition, across every rotation;
- a dead net1 NIC: exactly that node blamed on net1, in every round once its
  probers hold it, including the rounds right after the peer sets rotate, and never
  on the pod network;
- a node whose pod network is dead (its agent can report, nothing reaches it): it is
  ISOLATED on the pod network (its own agent says NETWORK_ISOLATED), nobody else is
  at fault;
- a node down altogether (no agent report): blamed on both networks by its probers;
- net1 split into two halves: a partition, nobody blamed;
- a flapping net1 peer (answers every other round): only that node is ever blamed;
- the load: no agent probes more than 16 peers per network, and the fleet's echoes
  per round are 50 x 16 x 2 networks x 3, not 50 x 49 x 2 x 3.
"""

from __future__ import annotations

from tests.blame.rounds import NET1, Fleet, everything_reachable, members

NODES = members(50)
NAMES = [m.node for m in NODES]
ROUNDS = 24  # five-minute rounds, two hours
EPOCH = 6  # rounds per epoch: the sets rotate three times
DEAD = "gpu-017"


def test_a_healthy_fleet_blames_nobody_across_rotations() -> None:
    fleet = Fleet(NODES, rounds_per_epoch=EPOCH)
    for turn in range(ROUNDS):
        found = fleet.play(turn, everything_reachable)
        assert all(not a.blamed and not a.partitioned and not a.isolated
                   for a in found.values()), turn
    assert fleet.probed_most == 16
    assert fleet.echoes == ROUNDS * 50 * 16 * 2 * 3


def test_a_dead_net1_nic_is_blamed_on_net1_in_every_round_across_rotations() -> None:
    def reach(reporter: str, target: str, network: str, turn: int) -> bool:
        return network != NET1 or DEAD not in (reporter, target)
    fleet = Fleet(NODES, rounds_per_epoch=EPOCH)
    pod, net1 = [], []
    for turn in range(ROUNDS):
        found = fleet.play(turn, reach)
        pod.append(sorted(found["pod"].blamed))
        net1.append(sorted(found[NET1].blamed))
        assert not found[NET1].partitioned
    assert all(b == [] for b in pod)
    assert net1[:1] == [[]]  # one round is not yet a holding
    assert all(b == [DEAD] for b in net1[2:]), net1  # rotations at rounds 6, 12, 18


def test_a_dead_pod_network_shows_the_node_isolated_and_nobody_blamed() -> None:
    def reach(reporter: str, target: str, network: str, turn: int) -> bool:
        return network != "pod" or DEAD not in (reporter, target)
    fleet = Fleet(NODES, rounds_per_epoch=EPOCH)
    for turn in range(ROUNDS):
        found = fleet.play(turn, reach)
        if turn >= 2:
            assert found["pod"].isolated == (DEAD,), turn
            assert dict(found["pod"].blamed) == {}
            assert not found["pod"].partitioned
            assert dict(found[NET1].blamed) == {}


def test_a_node_down_without_a_report_is_blamed_by_its_probers() -> None:
    fleet = Fleet(NODES, rounds_per_epoch=EPOCH, silent=frozenset({DEAD}))
    for turn in range(ROUNDS):
        found = fleet.play(turn, everything_reachable)
        if turn >= 2:
            assert list(found["pod"].blamed) == [DEAD], turn
            assert list(found[NET1].blamed) == [DEAD], turn
            # its 16 probers at least (after a rotation, the previous ones too, while
            # they still hold it)
            assert len(found["pod"].blamed[DEAD]) >= 16


def test_a_net1_split_in_halves_is_a_partition_not_a_blame() -> None:
    left = set(NAMES[:25])

    def reach(reporter: str, target: str, network: str, turn: int) -> bool:
        return network != NET1 or (reporter in left) == (target in left)
    fleet = Fleet(NODES, rounds_per_epoch=EPOCH)
    for turn in range(ROUNDS):
        found = fleet.play(turn, reach)
        assert dict(found[NET1].blamed) == {}, turn
        if turn >= 2:
            assert found[NET1].partitioned, turn
        assert not found["pod"].partitioned and dict(found["pod"].blamed) == {}


def test_a_flapping_net1_peer_is_the_only_node_ever_blamed() -> None:
    def reach(reporter: str, target: str, network: str, turn: int) -> bool:
        return network != NET1 or DEAD not in (reporter, target) or turn % 2 == 0
    fleet = Fleet(NODES, rounds_per_epoch=EPOCH)
    ever: set[str] = set()
    for turn in range(ROUNDS):
        found = fleet.play(turn, reach)
        ever |= set(found[NET1].blamed) | set(found["pod"].blamed)
        assert not found[NET1].partitioned
    assert ever == {DEAD}
