"""Network blame: from every node's ping view, decide which nodes are at fault.

Each node's `ping` check says which peers it could reach. One node's view alone
cannot tell "that peer is down" from "I am cut off"; the whole matrix can. This
module is the pure function that reads the matrix (reporter -> target ->
reachable) and returns a verdict per node plus a cluster-wide partition flag. The
controller and `healthd trigger` both use it; it does no I/O. `judge_rows` is the
same judgement for rows in sparse form ("reached everyone but these"), in time
linear in the nodes plus the failed pings, for fleets of thousands of nodes;
`judge_peer_rows` takes rows of bounded peer sets ("probed these, missed those"),
whose matrix is n x k.

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

A node's judgement (`NodeVerdict.verdict`, a `Judgement`; not to be confused with
the node's published verdict) is ISOLATED when isolated (its own view and, typically, the
others' agree), else BLAMED when blamed, else OK. OK means nothing points at this
node alone; with `partitioned` set the network is still broken, between groups.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

Matrix = Mapping[str, Mapping[str, bool]]
Edges = dict[tuple[str, str], bool]


class Judgement(enum.StrEnum):
    """What the ping reports say about one node."""

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
    def verdict(self) -> Judgement:
        if self.isolated:
            return Judgement.ISOLATED
        return Judgement.BLAMED if self.blamed else Judgement.OK


@dataclass(frozen=True)
class BlameReport:
    """Verdicts for every node (sorted by name) and the partition summary.

    `groups`: the nodes joined by successful pings, two or more per group, sorted.
    `partitioned`: pings between two such groups failed (see rule 2)."""

    verdicts: tuple[NodeVerdict, ...]
    partitioned: bool
    groups: tuple[tuple[str, ...], ...]

    def __getitem__(self, node: str) -> NodeVerdict:
        return self._by_node[node]

    @cached_property
    def _by_node(self) -> dict[str, NodeVerdict]:
        return {v.node: v for v in self.verdicts}

    def verdict_of(self, node: str) -> Judgement:
        return self[node].verdict

    @property
    def blamed(self) -> tuple[str, ...]:
        return tuple(v.node for v in self.verdicts if v.blamed)

    @property
    def isolated(self) -> tuple[str, ...]:
        return tuple(v.node for v in self.verdicts if v.isolated)

    @property
    def at_fault(self) -> tuple[str, ...]:
        """Nodes whose verdict is not OK."""
        return tuple(v.node for v in self.verdicts if v.verdict is not Judgement.OK)


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


# -- sparse rows: the same judgement, linear in nodes plus failed pings -----------------
#
# A fleet's pings are almost all successful, so a row is "every other node but these"
# (or "none at all"). `judge_rows` gives exactly `judge(to_matrix(rows))` without
# building the n x n matrix: every count `judge` takes over a row or a column is a
# total minus the few failures, and the cut between groups is subtracted per group.


@dataclass(frozen=True)
class Row:
    """One reporter's view: it probed every other node (or, when `probed` is given,
    those nodes: a bounded peer set, healthd.blame.peersets) and reached all but
    `unreached`, or (`reached_none`) it reached nobody. The nodes are every reporter
    plus every node a row names."""

    unreached: frozenset[str] = frozenset()
    reached_none: bool = False
    probed: frozenset[str] | None = None

    def targets(self, everyone: Iterable[str]) -> frozenset[str]:
        """Whom it probed: its peer set (plus any it names as unreached: a peer of
        the previous set still held), or everyone."""
        if self.probed is None:
            return frozenset(everyone)
        return self.probed | self.unreached


Rows = Mapping[str, Row]


def to_matrix(rows: Rows) -> dict[str, dict[str, bool]]:
    """The matrix `rows` stand for: n x n for rows that probed everyone (tests and
    small fleets), n x k for bounded peer sets."""
    nodes = _universe(rows)
    return {r: {t: not row.reached_none and t not in row.unreached
                for t in sorted(row.targets(nodes)) if t != r}
            for r, row in rows.items()}


def judge_rows(
    rows: Rows, *, share: float = 0.5, min_reporters: int = 2, min_targets: int = 2
) -> SparseReport:
    """`judge(to_matrix(rows))` in O(nodes + unreached entries) (plus sorting names);
    the per-node details are built on demand (see SparseReport)."""
    return SparseReport(rows, share, min_reporters, min_targets)


def judge_peer_rows(
    rows: Rows, *, share: float = 0.5, min_reporters: int = 2, min_targets: int = 2
) -> SparseReport | BlameReport:
    """The judgement of `rows`: `judge_rows` while every reporter probed everyone;
    `judge` over the n x k edges once some probe bounded peer sets (rows of agents
    that still probe everyone stand for n edges each)."""
    if all(row.probed is None for row in rows.values()):
        return judge_rows(rows, share=share, min_reporters=min_reporters,
                          min_targets=min_targets)
    return judge(to_matrix(rows), share=share, min_reporters=min_reporters,
                 min_targets=min_targets)


def _universe(rows: Rows) -> tuple[str, ...]:
    names = {str(r) for r in rows}
    for row in rows.values():
        names.update(row.unreached)
        names.update(row.probed or ())
    return tuple(sorted(names))


class _Tally:
    """Weights per node with per-group subtotals: the weight a node `t` sees, i.e.
    of the nodes other than `t` on its side of every cut, in O(1)."""

    def __init__(self, weights: Mapping[str, int], where: Mapping[str, int]) -> None:
        self._weights = weights
        self._where = where
        self._total = sum(weights.values())
        self._group: dict[int, int] = {}
        for n, w in weights.items():
            if n in where:
                self._group[where[n]] = self._group.get(where[n], 0) + w
        self._grouped = sum(self._group.values())

    def seen_by(self, t: str) -> int:
        other_groups = self._grouped - self._group.get(self._where[t], 0) \
            if t in self._where else 0
        return self._total - self._weights.get(t, 0) - other_groups


def _sparse_groups(nodes: tuple[str, ...], fails: Mapping[str, frozenset[str]]
                   ) -> tuple[tuple[str, ...], ...]:
    """`_groups` over the successful pings of rows in sparse form. Each scan of the
    unvisited nodes either visits a node or meets a failed ping, each once."""
    unvisited, open_reporters = set(nodes), set(fails)
    found: list[tuple[str, ...]] = []
    for start in nodes:
        if start not in unvisited:
            continue
        unvisited.discard(start)
        open_reporters.discard(start)
        group, queue = [start], [start]
        while queue:
            v = queue.pop()
            reached: list[str] = []
            if v in fails:  # v reached every unvisited node it did not name
                kept = {w for w in unvisited if w in fails[v]}
                reached.extend(unvisited - kept)
                unvisited = kept
            reached.extend(r for r in open_reporters if v not in fails[r] and r in unvisited)
            for w in reached:
                unvisited.discard(w)
                open_reporters.discard(w)
            group.extend(reached)
            queue.extend(reached)
        if len(group) >= 2:
            found.append(tuple(sorted(group)))
    return tuple(sorted(found))


class SparseReport:
    """What `judge` would return for the rows, with the same names: `partitioned`,
    `groups`, `blamed`, `isolated`, `at_fault`, `report[node]` (a NodeVerdict) and
    `verdicts`. Names of reporters and targets are listed only on demand: a reporter
    that reached nobody missed every peer, so `verdicts` (all of them) is the one
    part that is not linear; `report()` is that expansion as a BlameReport."""

    def __init__(self, rows: Rows, share: float, min_reporters: int, min_targets: int) -> None:
        self.nodes = _universe(rows)
        self._share = share
        self._silent = frozenset(str(r) for r, row in rows.items() if row.reached_none)
        self._fails = {str(r): row.unreached - {str(r)} for r, row in rows.items()
                       if not row.reached_none}
        self._namers: dict[str, list[str]] = {}  # target -> reporters that named it
        for r, fails in self._fails.items():
            for t in fails:
                self._namers.setdefault(t, []).append(r)
        self.groups = _sparse_groups(self.nodes, self._fails)
        self.partitioned = len(self.groups) >= 2  # every reporter probed every group
        self._where = {n: i for i, group in enumerate(self.groups) for n in group}
        self._reporters = self._tally(self._fails.keys() | self._silent)
        self._targets = self._tally(self.nodes)
        failed = self._tally(self._silent)
        self._failed = {t: failed.seen_by(t) + len(self._named_by(t)) for t in self.nodes}
        self._isolated = self._find_isolated(min_targets)
        credible_failed = self._tally(self._isolated & self._silent)
        uncredible = self._tally(self._isolated)
        self._credible = {t: self._reporters.seen_by(t) - uncredible.seen_by(t)
                          for t in self.nodes}
        self._credible_failed = {
            t: self._failed[t] - credible_failed.seen_by(t)
            - sum(1 for r in self._named_by(t) if r in self._isolated) for t in self.nodes}
        self._blamed = frozenset(
            t for t in self.nodes if self._credible[t] >= min_reporters
            and _most(self._credible_failed[t], self._credible[t], share))

    def _tally(self, names: Iterable[str], weight: Mapping[str, int] | None = None) -> _Tally:
        weights = {n: 1 for n in names} if weight is None else dict(weight)
        return _Tally(weights, self._where)

    def _cut(self, a: str, b: str) -> bool:
        where = self._where
        return a in where and b in where and where[a] != where[b]

    def _named_by(self, t: str) -> list[str]:
        """The reporters that named `t`, on its side of every cut."""
        return [r for r in self._namers.get(t, ()) if not self._cut(r, t)]

    def _find_isolated(self, min_targets: int) -> frozenset[str]:
        """Rule 4: a failed ping to `t` is explained by `t` when the other reporters
        that probed it mostly failed too; isolated: mostly unexplained failures."""
        unexplained = {t: int(not _most(self._failed[t] - 1, self._reporters.seen_by(t) - 1,
                                         self._share)) for t in self.nodes}
        silent_fault = self._tally((), unexplained)  # a silent reporter failed every target
        isolated = set()
        for r in self._fails.keys() | self._silent:
            targets = self._targets.seen_by(r)
            if r in self._silent:
                own_fault = silent_fault.seen_by(r)
            else:
                own_fault = sum(unexplained[t] for t in self._fails[r] if not self._cut(r, t))
            if targets >= min_targets and _most(own_fault, targets, self._share):
                isolated.add(r)
        return frozenset(isolated)

    # -- what judge() returns ----------------------------------------------------------

    def verdict_of(self, node: str) -> Judgement:
        """The node's verdict in O(1) (KeyError for a node no row names)."""
        if node not in self._failed:
            raise KeyError(node)
        if node in self._isolated:
            return Judgement.ISOLATED
        return Judgement.BLAMED if node in self._blamed else Judgement.OK

    def __getitem__(self, node: str) -> NodeVerdict:
        if node not in self._failed:
            raise KeyError(node)
        silent = [r for r in self._silent if r != node and r not in self._isolated
                  and not self._cut(r, node)]
        named = [r for r in self._named_by(node) if r not in self._isolated]
        if node in self._silent:
            missed = [t for t in self.nodes if t != node and not self._cut(node, t)]
        else:
            missed = [t for t in self._fails.get(node, ()) if not self._cut(node, t)]
        reports = node in self._silent or node in self._fails
        return NodeVerdict(
            node=node, blamed=node in self._blamed, isolated=node in self._isolated,
            unreachable_from=tuple(sorted(silent + named)), reporters=self._credible[node],
            unreachable_targets=tuple(sorted(missed)),
            targets=self._targets.seen_by(node) if reports else 0)

    @property
    def verdicts(self) -> tuple[NodeVerdict, ...]:
        return tuple(self[n] for n in self.nodes)

    def report(self) -> BlameReport:
        return BlameReport(self.verdicts, self.partitioned, self.groups)

    @property
    def blamed(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n in self._blamed)

    @property
    def isolated(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n in self._isolated)

    @property
    def at_fault(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n in self._blamed or n in self._isolated)
