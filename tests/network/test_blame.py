"""Network blame over a reachability matrix (healthd.blame.judge.judge).

Tests, as named scenarios and as hypothesis properties: everything reachable ->
nobody at fault; one dead node -> it alone is blamed (never isolated by others'
reports); one cut-off node -> ISOLATED, both views agreeing; an even or uneven split
-> a partition with nobody blamed; missing rows and columns; self-entries and dict
order change nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.blame.judge import Judgement, Matrix, judge

NAMES = [f"n{i:02d}" for i in range(12)]


def full(
    nodes: list[str], ok: Callable[[str, str], bool] = lambda r, t: True
) -> dict[str, dict[str, bool]]:
    """Every node probes every other; `ok(r, t)` says whether it got through."""
    return {r: {t: ok(r, t) for t in nodes if t != r} for r in nodes}


def with_dead(nodes: list[str], dead: str, reports: bool) -> dict[str, dict[str, bool]]:
    """`dead` answers nobody; with `reports` it also sends a row of failures."""
    matrix = full(nodes, lambda r, t: dead not in (r, t))
    if not reports:
        del matrix[dead]
    return matrix


def split(nodes: list[str], left: int) -> dict[str, dict[str, bool]]:
    """The first `left` nodes reach each other, the rest reach each other."""
    side = {n: i < left for i, n in enumerate(nodes)}
    return full(nodes, lambda r, t: side[r] == side[t])


# --- scenarios ---------------------------------------------------------------


def test_everything_fine() -> None:
    report = judge(full(NAMES[:4]))
    assert report.at_fault == () and not report.partitioned
    assert report.groups == (tuple(NAMES[:4]),)


def test_one_node_down_is_blamed_by_everyone() -> None:
    report = judge(with_dead(NAMES[:5], "n02", reports=False))
    assert report.blamed == ("n02",) and report.isolated == ()
    assert report["n02"].verdict is Judgement.BLAMED
    assert report["n02"].unreachable_from == ("n00", "n01", "n03", "n04")
    assert report["n00"].verdict is Judgement.OK


def test_one_node_cut_off_is_isolated_and_both_views_agree() -> None:
    report = judge(with_dead(NAMES[:5], "n02", reports=True))
    assert report.at_fault == ("n02",)
    verdict = report["n02"]
    assert verdict.verdict is Judgement.ISOLATED and verdict.blamed
    assert verdict.unreachable_targets == ("n00", "n01", "n03", "n04")
    assert not report.partitioned


def test_even_split_is_a_partition_not_a_blame() -> None:
    report = judge(split(NAMES[:6], 3))
    assert report.partitioned
    assert report.at_fault == ()
    assert report.groups == (tuple(NAMES[:3]), tuple(NAMES[3:6]))


def test_uneven_split_is_a_partition_too() -> None:
    report = judge(split(NAMES[:7], 4))
    assert report.partitioned and report.at_fault == ()


def test_dead_node_inside_a_partition_is_still_blamed() -> None:
    nodes = NAMES[:7]
    matrix = split(nodes[:6], 3)
    for row in matrix.values():
        row[nodes[6]] = False
    report = judge(matrix)
    assert report.partitioned and report.blamed == (nodes[6],)


def test_half_the_fleet_dead_blames_the_dead_not_the_survivors() -> None:
    nodes = NAMES[:5]
    matrix = full(nodes, lambda r, t: t in nodes[:2])
    for dead in nodes[2:]:
        del matrix[dead]
    report = judge(matrix)
    assert report.blamed == tuple(nodes[2:]) and report.isolated == ()


def test_missing_rows_and_columns() -> None:
    matrix: Matrix = {
        "a": {"b": True, "d": False},
        "b": {"c": True, "d": False},
        "c": {"a": True},
    }
    report = judge(matrix)
    assert report.blamed == ("d",)
    assert report["d"].targets == 0
    assert report["c"].reporters == 1 and report["c"].verdict is Judgement.OK


def test_one_reporter_is_not_enough_to_blame() -> None:
    report = judge({"a": {"b": False}})
    assert report.at_fault == ()
    assert report["b"].unreachable_from == ("a",)


def test_isolated_reporters_do_not_count_toward_blame() -> None:
    nodes = NAMES[:6]
    # n00 and n01 are cut off; their failed pings to n02 must not blame it.
    cut = {"n00", "n01"}
    report = judge(full(nodes, lambda r, t: not ({r, t} & cut)))
    assert report.isolated == ("n00", "n01")
    assert report["n02"].verdict is Judgement.OK
    assert report["n02"].reporters == 3


def test_empty_matrix() -> None:
    report = judge({})
    assert report.verdicts == () and not report.partitioned


def test_unknown_node_lookup_raises_key_error() -> None:
    with pytest.raises(KeyError):
        judge(full(NAMES[:2]))["zz"]


# --- properties --------------------------------------------------------------

nodes_st = st.integers(min_value=1, max_value=10).map(lambda n: NAMES[:n])


@st.composite
def healthy_sparse(draw: st.DrawFn) -> dict[str, dict[str, bool]]:
    """A healthy fleet where some nodes did not report and some pairs were not probed."""
    nodes = draw(nodes_st)
    matrix = full(nodes)
    for r in list(matrix):
        if draw(st.booleans()) and len(matrix) > 1:
            del matrix[r]
            continue
        for t in list(matrix[r]):
            if draw(st.integers(0, 3)) == 0:
                del matrix[r][t]
    return matrix


@settings(max_examples=120, deadline=None)
@given(healthy_sparse())
def test_everything_reachable_nobody_at_fault(matrix: dict[str, dict[str, bool]]) -> None:
    report = judge(matrix)
    assert report.blamed == () and report.isolated == ()
    assert not report.partitioned


@settings(max_examples=120, deadline=None)
@given(
    st.integers(min_value=3, max_value=12),
    st.data(),
    st.booleans(),
)
def test_single_dead_node_is_the_only_one_blamed(
    n: int, data: st.DataObject, reports: bool
) -> None:
    nodes = NAMES[:n]
    dead = data.draw(st.sampled_from(nodes))
    report = judge(with_dead(nodes, dead, reports))
    assert report.blamed == (dead,)
    assert set(report.isolated) <= {dead}
    assert report.isolated == ((dead,) if reports else ())
    assert not report.partitioned


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=6), st.integers(min_value=2, max_value=6))
def test_any_split_into_two_groups_is_a_partition(left: int, right: int) -> None:
    report = judge(split(NAMES[: left + right], left))
    assert report.partitioned and report.at_fault == ()
    assert sorted(len(g) for g in report.groups) == sorted((left, right))


random_matrix = st.lists(
    st.tuples(st.sampled_from(NAMES[:8]), st.sampled_from(NAMES[:8]), st.booleans()),
    max_size=60,
).map(lambda cells: _build(cells))


def _build(cells: list[tuple[str, str, bool]]) -> dict[str, dict[str, bool]]:
    matrix: dict[str, dict[str, bool]] = {}
    for r, t, ok in cells:
        matrix.setdefault(r, {})[t] = ok
    return matrix


@settings(max_examples=120, deadline=None)
@given(random_matrix, st.randoms(use_true_random=False))
def test_result_does_not_depend_on_dict_order(
    matrix: dict[str, dict[str, bool]], rnd: random.Random
) -> None:
    rows = list(matrix.items())
    rnd.shuffle(rows)
    shuffled = {}
    for r, row in rows:
        cells = list(row.items())
        rnd.shuffle(cells)
        shuffled[r] = dict(cells)
    assert judge(shuffled) == judge(matrix)


@settings(max_examples=120, deadline=None)
@given(random_matrix, st.dictionaries(st.sampled_from(NAMES[:8]), st.booleans()))
def test_self_entries_are_ignored(
    matrix: dict[str, dict[str, bool]], selfs: dict[str, bool]
) -> None:
    with_selfs = {r: dict(row) for r, row in matrix.items()}
    for n, ok in selfs.items():
        if n in with_selfs:
            with_selfs[n][n] = ok
    assert judge(with_selfs) == judge(matrix)


@settings(max_examples=120, deadline=None)
@given(random_matrix)
def test_invariants_on_any_matrix(matrix: dict[str, dict[str, bool]]) -> None:
    report = judge(matrix)
    named = set(matrix) | {t for row in matrix.values() for t in row}
    assert {v.node for v in report.verdicts} <= named
    for v in report.verdicts:
        # A node every probe reached is never blamed; one that reached every
        # target is never isolated; blame needs at least two credible reporters.
        if not any(row.get(v.node) is False for r, row in matrix.items() if r != v.node):
            assert not v.blamed
        if not any(ok is False for t, ok in matrix.get(v.node, {}).items() if t != v.node):
            assert not v.isolated
        if v.blamed:
            assert v.reporters >= 2 and len(v.unreachable_from) * 2 > v.reporters
