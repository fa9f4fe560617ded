"""Network blame from the agents' ping reports: which node do its peers fail to
reach, on which network. Pure: the controller announces it
(healthd.blame.announce) and `healthd status` shows it, from the same objects.

One agent's `ping` check cannot tell "that peer is down" from "my own link is
down"; the fleet can. Every agent publishes what its latest ping round saw in its
`health` annotation (its ping view, healthd.published.PingView, built by
healthd.agent.node_view): per network, the peers of its bounded set
(healthd.blame.peersets) it `reached` and those it holds `unreached`, so each node is
judged from the views of the peers that probed it (n x k edges, `judge`). An older
agent's view has no `reached`: it probed every other agent node and reached all but
`unreached`, or, when `isolated`, almost none; while every view is of that kind the
network is judged in the sparse form (`judge_rows`, linear in nodes plus unreached
entries). This module reads those objects, judges each network on its own, and says:

- which nodes most of their peers cannot reach on a network (BLAMED). A node is
  blamed on the network that fails only: a dead `net1` NIC never blames the node
  on the pod network;
- on the pod network, a node that cannot reach most peers (ISOLATED) already
  carries `NETWORK_ISOLATED` from its own agent: it is not blamed. On a secondary
  network the agent's own view cannot tell its NIC from the fabric; when most of
  its peers cannot reach it either, it is blamed there too;
- whether a network is partitioned (pings fail between groups of nodes, or most
  nodes reached almost nobody: a whole fabric down, or an even split): nobody is
  blamed on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from checks.base import POD_NETWORK
from healthd.blame.judge import BlameReport, Judgement, Row, SparseReport, judge_peer_rows
from healthd.kube.conventions import Keys
from healthd.kube.objects import name_of
from healthd.published import Health, NetworkView, read_health

SHARE = 0.5  # "most" means more than this share (healthd.blame.judge)
NAMES_SHOWN = 10  # reporters named in an Event; the rest are counted
Obj = Mapping[str, Any]  # a Node (healthd.kube.shapes), typed or as read


# -- reading the reports ---------------------------------------------------------------


def ping_rows(node: Obj, keys: Keys) -> dict[str, Row]:
    """The node's published ping view as one sparse row per network (POD_NETWORK
    for the pod network); empty when it has none (no agent, ping not judged yet,
    or an annotation that is not what agents write). A malformed secondary entry
    is left out on its own."""
    doc = read_health(node, keys)
    ping = doc.ping if isinstance(doc, Health) else None
    if ping is None:
        return {}
    rows = {POD_NETWORK: _row(ping.pod)}
    for network, view in ping.networks.items():
        if network not in ("", POD_NETWORK):
            rows[network] = _row(view)
    return rows


def _row(view: NetworkView) -> Row:
    """A view of a bounded peer set names whom it probed (reached or not); an older
    agent's names only the misses, of every other node."""
    if view.reached is not None:
        return Row(frozenset(view.unreached),
                   probed=frozenset(view.reached) | frozenset(view.unreached))
    return Row(reached_none=True) if view.isolated else Row(frozenset(view.unreached))


def _silent(row: Row) -> bool:
    """A reporter that reached none of the peers it probed (said so, for an agent
    that probes everyone)."""
    if row.probed is None:
        return row.reached_none
    return bool(row.probed) and row.unreached >= row.probed


def ping_row(node: Obj, keys: Keys, network: str = POD_NETWORK) -> Row | None:
    """The node's row on one network; None when it published none there."""
    return ping_rows(node, keys).get(network)


def rows_of(nodes: Iterable[Obj], keys: Keys, network: str = POD_NETWORK) -> dict[str, Row]:
    """Every node's ping row on `network`, nodes without one left out."""
    return {name_of(n): row for n in nodes if (row := ping_row(n, keys, network)) is not None}


def rows_by_network(nodes: Iterable[Obj], keys: Keys) -> dict[str, dict[str, Row]]:
    """network -> node -> row, over every node's published view."""
    out: dict[str, dict[str, Row]] = {POD_NETWORK: {}}
    for node in nodes:
        for network, row in ping_rows(node, keys).items():
            out.setdefault(network, {})[name_of(node)] = row
    return out


# -- judging ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Assessment:
    """What the fleet's ping reports say about one network. `blamed`: node -> the
    credible reporters that cannot reach it (out of `peers[node]` that probed it)."""

    reporters: int
    blamed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    peers: Mapping[str, int] = field(default_factory=dict)
    isolated: tuple[str, ...] = ()
    partitioned: bool = False
    groups: tuple[tuple[str, ...], ...] = ()
    why: str = ""  # what the partition looks like, for a person
    network: str = POD_NETWORK


def assess(rows: Mapping[str, Row], *, share: float = SHARE,
           network: str = POD_NETWORK) -> Assessment:
    """Judge one network's rows (healthd.blame.judge's rules), with one guard: when most
    reporters reached almost nobody, each of them missed every peer and none says
    which, so the reports cannot single a node out; that is a partition (an even
    split, or the whole fabric down, reads exactly so), and nobody is blamed.

    On the pod network an ISOLATED node is left to its own agent's
    NETWORK_ISOLATED; on a secondary network a node most credible peers cannot
    reach is blamed even when it also says it is isolated (see the module doc)."""
    silent = sum(1 for row in rows.values() if _silent(row))
    if len(rows) >= 2 and silent > share * len(rows):
        why = (f"{silent} of {len(rows)} nodes reached almost none of their peers on "
               f"{network_name(network)}: it is split or down between many nodes")
        return Assessment(len(rows), partitioned=True, why=why, network=network)
    report = judge_peer_rows(rows, share=share)
    blamed = [n for n in report.blamed
              if network != POD_NETWORK or report.verdict_of(n) is Judgement.BLAMED]
    details = {n: report[n] for n in blamed}
    return Assessment(
        reporters=len(rows),
        blamed={n: d.unreachable_from for n, d in details.items()},
        peers={n: d.reporters for n, d in details.items()},
        isolated=report.isolated,
        partitioned=report.partitioned,
        groups=report.groups,
        why=_partition_text(report, network) if report.partitioned else "",
        network=network)


def assess_networks(rows: Mapping[str, Mapping[str, Row]], *,
                    share: float = SHARE) -> dict[str, Assessment]:
    """`assess` for every network of `rows_by_network`, each on its own."""
    return {network: assess(by_node, share=share, network=network)
            for network, by_node in sorted(rows.items())}


def network_name(network: str) -> str:
    return "the pod network" if network == POD_NETWORK else f"network {network}"


def _partition_text(report: SparseReport | BlameReport, network: str) -> str:
    sizes = " + ".join(str(len(g)) for g in report.groups)
    sides = "; ".join(_names(g, 3) for g in report.groups)
    where = "" if network == POD_NETWORK else f" on network {network}"
    return (f"pings{where} fail between {len(report.groups)} groups of nodes "
            f"({sizes}: {sides})")


def _names(names: tuple[str, ...] | list[str], shown: int = NAMES_SHOWN) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def blame_message(node: str, reporters: tuple[str, ...], peers: int,
                  network: str = POD_NETWORK) -> str:
    """The PeerUnreachable Event's message on a blamed node."""
    if network == POD_NETWORK:
        return (f"{len(reporters)} of {peers} peers cannot reach {node} by ping: "
                f"{_names(reporters)}. The node, its network link or its switch port is "
                "likely at fault; its own agent may not see it")
    return (f"{len(reporters)} of {peers} peers cannot reach {node} by ping on network "
            f"{network}: {_names(reporters)}. Its {network} interface, cable, transceiver "
            f"or switch port is likely at fault (see its nic check); other networks "
            "are not affected")
