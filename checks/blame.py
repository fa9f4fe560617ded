"""Network blame: from every node's ping view, decide which nodes are at fault.

Each node's `ping` check says which peers it could reach. One node's view alone
cannot tell "that peer is down" from "I am cut off"; the whole matrix can. This
module is the pure function that reads the matrix (reporter -> target ->
reachable) and returns a verdict per node plus a cluster-wide partition flag. The
controller and `healthd trigger` both use it; it does no I/O.

The rules (`share` is the threshold, 0.5 by default; "most" means MORE than it):

1. Self-entries are ignored. Nodes are every reporter and every target; a node may
   have no row (it did not report) or be missing from other rows (not probed).
2. Groups: nodes joined by at least one successful ping (in either direction;
   echo is a round trip) form connected groups. When pings between two groups of
   at least two nodes each failed, the network is PARTITIONED: a cut between
   groups is a switch or uplink fault, not a node fault, so the failed pings
   between such groups are left out of every judgement below. A node that reaches
   nobody and that nobody reaches is a group of one, never a side of a partition.
3. A failed ping reporter -> target is *explained by the target* when the other
   reporters that probed the target mostly failed too (at least one other).
4. ISOLATED: a node that probed at least `min_targets` targets and could not reach
   most of them for reasons not explained by those targets (its own view, checked
   against everyone else's).
5. BLAMED: most of the reporters that probed the node, not counting isolated
   reporters, cannot reach it, and there are at least `min_reporters` of them.
   A down node with no report of its own is blamed, never isolated.

A node's `verdict` is ISOLATED when isolated (its own view and, typically, the
others' agree), else BLAMED when blamed, else OK. OK means nothing points at this
node alone; with `partitioned` set the network is still broken, between groups.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Matrix = Mapping[str, Mapping[str, bool]]
Edges = dict[tuple[str, str], bool]


class Verdict(enum.StrEnum):
    OK = "OK"
    BLAMED = "BLAMED"
    ISOLATED = "ISOLATED"


@dataclass(frozen=True)
class NodeVerdict:
    """What the matrix says about one node.

    `unreachable_from`: the credible (non-isolated) reporters that could not reach
    it, out of `reporters` credible reporters that probed it. `unreachable_targets`:
    the peers it could not reach, out of `targets` it probed."""

    node: str
    blamed: bool
    isolated: bool
    unreachable_from: tuple[str, ...]
    reporters: int
    unreachable_targets: tuple[str, ...]
    targets: int

    @property
    def verdict(self) -> Verdict:
        if self.isolated:
            return Verdict.ISOLATED
        return Verdict.BLAMED if self.blamed else Verdict.OK


@dataclass(frozen=True)
class BlameReport:
    """Verdicts for every node (sorted by name) and the partition summary.

    `groups`: the nodes joined by successful pings, two or more per group, sorted.
    `partitioned`: pings between two such groups failed (see rule 2)."""

    verdicts: tuple[NodeVerdict, ...]
    partitioned: bool
    groups: tuple[tuple[str, ...], ...]

    def __getitem__(self, node: str) -> NodeVerdict:
        for verdict in self.verdicts:
            if verdict.node == node:
                return verdict
        raise KeyError(node)

    @property
    def blamed(self) -> tuple[str, ...]:
        return tuple(v.node for v in self.verdicts if v.blamed)

    @property
    def isolated(self) -> tuple[str, ...]:
        return tuple(v.node for v in self.verdicts if v.isolated)

    @property
    def at_fault(self) -> tuple[str, ...]:
        """Nodes whose verdict is not OK."""
        return tuple(v.node for v in self.verdicts if v.verdict is not Verdict.OK)


def judge(
    matrix: Matrix, *, share: float = 0.5, min_reporters: int = 2, min_targets: int = 2
) -> BlameReport:
    """Verdicts for every node named in `matrix` (see the module docstring)."""
    edges = _edges(matrix)
    nodes = sorted({n for edge in edges for n in edge} | {str(r) for r in matrix})
    groups = _groups(nodes, edges)
    kept = _without_cuts(edges, groups)
    partitioned = len(kept) < len(edges)
    edges = kept
    views = _Views.of(edges)
    isolated = {n for n in nodes if _is_isolated(n, views, share, min_targets)}
    verdicts = tuple(_verdict(n, views, isolated, share, min_reporters) for n in nodes)
    return BlameReport(verdicts, partitioned, groups)


def _edges(matrix: Matrix) -> Edges:
    """Flatten to (reporter, target) -> reachable, self-entries dropped."""
    return {
        (str(r), str(t)): bool(ok) for r, row in matrix.items() for t, ok in row.items() if r != t
    }


def _groups(nodes: Iterable[str], edges: Edges) -> tuple[tuple[str, ...], ...]:
    """Connected groups of two or more nodes over successful pings (union-find)."""
    parent = {n: n for n in nodes}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for (r, t), ok in edges.items():
        if ok:
            a, b = sorted((root(r), root(t)))
            parent[b] = a
    members: dict[str, list[str]] = {}
    for n in parent:
        members.setdefault(root(n), []).append(n)
    return tuple(sorted(tuple(sorted(m)) for m in members.values() if len(m) >= 2))


def _without_cuts(edges: Edges, groups: tuple[tuple[str, ...], ...]) -> Edges:
    """Drop the pings between two different groups (all failed, or the groups
    would be one): they measure the cut, not a node."""
    where = {n: i for i, group in enumerate(groups) for n in group}
    return {
        (r, t): ok
        for (r, t), ok in edges.items()
        if r not in where or t not in where or where[r] == where[t]
    }


def _most(part: int, whole: int, share: float) -> bool:
    return whole > 0 and part > share * whole


@dataclass(frozen=True)
class _Views:
    """The edges indexed both ways: each reporter's row and each target's column."""

    rows: Mapping[str, Mapping[str, bool]]
    columns: Mapping[str, Mapping[str, bool]]
    failed: Mapping[str, int]  # per target: reporters that could not reach it

    @classmethod
    def of(cls, edges: Edges) -> _Views:
        rows: dict[str, dict[str, bool]] = {}
        columns: dict[str, dict[str, bool]] = {}
        for (r, t), ok in edges.items():
            rows.setdefault(r, {})[t] = ok
            columns.setdefault(t, {})[r] = ok
        failed = {t: list(col.values()).count(False) for t, col in columns.items()}
        return cls(rows, columns, failed)

    def row(self, node: str) -> Mapping[str, bool]:
        return self.rows.get(node, {})

    def column(self, node: str) -> Mapping[str, bool]:
        return self.columns.get(node, {})

    def failures(self, node: str) -> int:
        return self.failed.get(node, 0)


def _explained_by_target(reporter: str, target: str, views: _Views, share: float) -> bool:
    """Whether the other reporters that probed `target` mostly failed too."""
    column = views.column(target)
    mine = column.get(reporter)
    others = len(column) - (mine is not None)
    failed = views.failures(target) - (mine is False)
    return _most(failed, others, share)


def _is_isolated(node: str, views: _Views, share: float, min_targets: int) -> bool:
    row = views.row(node)
    if len(row) < min_targets:
        return False
    own_fault = [
        t for t, ok in row.items() if not ok and not _explained_by_target(node, t, views, share)
    ]
    return _most(len(own_fault), len(row), share)


def _verdict(
    node: str, views: _Views, isolated: set[str], share: float, min_reporters: int
) -> NodeVerdict:
    column = {r: ok for r, ok in views.column(node).items() if r not in isolated}
    failed_from = tuple(sorted(r for r, ok in column.items() if not ok))
    row = views.row(node)
    failed_to = tuple(sorted(t for t, ok in row.items() if not ok))
    blamed = len(column) >= min_reporters and _most(len(failed_from), len(column), share)
    return NodeVerdict(
        node=node,
        blamed=blamed,
        isolated=node in isolated,
        unreachable_from=failed_from,
        reporters=len(column),
        unreachable_targets=failed_to,
        targets=len(row),
    )
