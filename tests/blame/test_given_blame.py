"""The fleet's blame handed back to the nodes that probe a blamed node, round after
round (tests/blame/rounds.py: the peer sets the controller publishes, carrying the
latest judgement's blame; the real ping check, verdict machine and annotation; ICMP
simulated). What an operator sees when net1 NICs die:

- four nodes, two of whose net1 NICs die: the controller blames those two on net1,
  they stay ERR (each holds NETWORK_ISOLATED on net1), and the two whose NICs are
  fine reach every peer the controller does not blame, so once the hold of what they
  raised before the blame came is over (`min_hold` runs) they are out of ERR and stay
  out: only PEER_UNREACHABLE (WARN) about the dead two;
- fifty nodes with 16 net1 peers each, nine of one node's peers dying: the same for
  every node whose set they fill, across the rotation of the sets.
"""

from __future__ import annotations

from healthd.agent.verdict import Policy
from tests.blame.rounds import NET1, Fleet, Reach, members

ISOLATED = "NETWORK_ISOLATED"
SETTLED = Policy().min_hold + 1  # the first round after a holding raised in round 1 may end


def net1_dead(dead: set[str]) -> Reach:
    def reach(reporter: str, target: str, network: str, turn: int) -> bool:
        return network != NET1 or not {reporter, target} & dead
    return reach


def test_two_dead_net1_nics_of_four_leave_the_other_two_out_of_err() -> None:
    fleet = Fleet(members(4))
    dead = {"gpu-002", "gpu-003"}
    for turn in range(SETTLED + 3):
        found = fleet.play(turn, net1_dead(dead))
        if turn >= 1:
            assert set(found[NET1].blamed) == dead, turn
            assert not found[NET1].partitioned and not found["pod"].blamed
        if turn >= SETTLED:
            assert fleet.verdicts() == {"gpu-000": "WARN", "gpu-001": "WARN",
                                        "gpu-002": "ERR", "gpu-003": "ERR"}, turn
            assert fleet.holding(ISOLATED) == dead, turn
            assert fleet.holding("PEER_UNREACHABLE") == {"gpu-000", "gpu-001"}, turn


def test_in_fifty_nodes_a_node_most_of_whose_peers_die_is_not_isolated() -> None:
    fleet = Fleet(members(50))  # 16 peers per network, the sets rotating every 12 rounds
    victim = "gpu-025"
    # 9 of its 16 net1 peers: without the blame it would hold NETWORK_ISOLATED
    dead = set(sorted(fleet.sets(0)[victim].probed(NET1))[:9])
    for turn in range(fleet.rounds_per_epoch + 6):
        found = fleet.play(turn, net1_dead(dead))
        if turn >= 1:
            assert set(found[NET1].blamed) == dead, turn
            assert not found[NET1].partitioned and not found["pod"].blamed
        if turn >= SETTLED:
            assert fleet.holding(ISOLATED) == dead, turn
            verdicts = fleet.verdicts()
            assert {n for n, v in verdicts.items() if v == "ERR"} == dead, turn
            assert verdicts[victim] == "WARN", turn
