"""`healthd.blame.judge.judge_rows`, the sparse entry point the controller uses: for any
rows ("reached everyone but these", "reached nobody") it says exactly what the
dense `judge` says of the same matrix (hypothesis), the cheap per-node answers
agree with the full report, and a 2,000-node fleet with three failed pings is
judged without building the matrix (the time is printed, not asserted)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.blame.judge import Judgement, Row, SparseReport, judge, judge_rows, to_matrix

NAMES = [f"n{i}" for i in range(9)]


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Row]:
    """Nodes on one to three sides of a cut, reporters among them each missing the
    other sides plus a few more (maybe itself, maybe nodes that never report), some
    having reached nobody."""
    count = draw(st.integers(min_value=0, max_value=8))
    side = {n: draw(st.integers(0, draw(st.integers(0, 2)))) for n in NAMES}
    reporters = draw(st.lists(st.sampled_from(NAMES[:count + 1]), unique=True,
                              max_size=count))
    out = {}
    for r in reporters:
        silent = draw(st.integers(0, 4)) == 0
        cut = frozenset(n for n in NAMES[:count + 1] if side[n] != side[r])
        unreached = draw(st.frozensets(st.sampled_from(NAMES), max_size=4)) | cut
        out[r] = Row(frozenset() if silent else unreached, reached_none=silent)
    return out


def halves(nodes: list[str], left: int) -> dict[str, Row]:
    side = {n: i < left for i, n in enumerate(nodes)}
    return {r: Row(frozenset(t for t in nodes if side[t] != side[r])) for r in nodes}


thresholds = st.sampled_from([0.5, 0.3, 0.66])
minimums = st.integers(min_value=0, max_value=3)


@settings(max_examples=500, deadline=None)
@given(rows(), thresholds, minimums, minimums)
def test_the_sparse_judgement_equals_the_dense_one(
        given_rows: dict[str, Row], share: float, min_reporters: int, min_targets: int) -> None:
    options = {"share": share, "min_reporters": min_reporters, "min_targets": min_targets}
    dense = judge(to_matrix(given_rows), **options)
    sparse = judge_rows(given_rows, **options)
    assert sparse.report() == dense
    assert (sparse.blamed, sparse.isolated, sparse.at_fault) == (
        dense.blamed, dense.isolated, dense.at_fault)
    assert (sparse.partitioned, sparse.groups) == (dense.partitioned, dense.groups)
    assert all(sparse.verdict_of(v.node) is v.verdict for v in dense.verdicts)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=6), st.integers(min_value=2, max_value=6))
def test_a_split_is_the_same_partition_both_ways(left: int, right: int) -> None:
    split = halves(NAMES[: left + right], left)
    assert judge_rows(split).report() == judge(to_matrix(split))
    assert judge_rows(split).partitioned and judge_rows(split).at_fault == ()


def test_named_scenarios_read_as_the_dense_ones_do() -> None:
    nodes = NAMES[:5]
    down = {r: Row(frozenset({"n2"})) for r in nodes if r != "n2"}
    assert judge_rows(down).blamed == ("n2",)
    assert judge_rows(down)["n2"].unreachable_from == ("n0", "n1", "n3", "n4")
    cut_off = {**down, "n2": Row(reached_none=True)}
    report = judge_rows(cut_off)
    assert report.verdict_of("n2") is Judgement.ISOLATED and report.blamed == ("n2",)
    assert report["n2"].unreachable_targets == ("n0", "n1", "n3", "n4")
    with pytest.raises(KeyError):
        report.verdict_of("zz")
    with pytest.raises(KeyError):
        report["zz"]


def timed(rows: dict[str, Row], what: str) -> SparseReport:
    start = time.perf_counter()
    report = judge_rows(rows)
    print(f"\n{what}: judged in {(time.perf_counter() - start) * 1000:.1f} ms")
    return report


FLEET = [f"gpu-{i:04d}" for i in range(2000)]


def test_a_large_fleet_is_judged_without_the_matrix() -> None:
    rows = {n: Row() for n in FLEET[1:]}
    for reporter in FLEET[1:4]:
        rows[reporter] = Row(frozenset({FLEET[0]}))  # three reporters missed one node
    report = timed(rows, "2,000 nodes, 3 unreached entries")
    assert report.at_fault == () and report.groups == (tuple(FLEET),)
    assert report[FLEET[0]].unreachable_from == tuple(FLEET[1:4])
    assert report[FLEET[0]].reporters == 1999


def test_a_large_fleet_with_one_node_down_and_one_cut_off() -> None:
    down, cut_off = FLEET[0], FLEET[1]
    rows = {n: Row(frozenset({down, cut_off})) for n in FLEET[2:]}
    rows[cut_off] = Row(reached_none=True)
    report = timed(rows, "2,000 nodes, one down, one cut off")
    assert report.verdict_of(down) is Judgement.BLAMED
    assert report.verdict_of(cut_off) is Judgement.ISOLATED
    assert report.at_fault == (down, cut_off) and not report.partitioned
