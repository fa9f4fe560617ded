"""Every rule of the verdict state machine, one table or scenario each: fatal codes,
events and diagnostics raising at once, steady signals on their second sighting (two
consecutive runs or `seen` of the last `runs`), PASS findings never held, recovery
after exactly `recover_after` clean runs of the raising check, quadrupled per flap, at
least twice the signal's longest silence, capped, never before the minimum hold, flaps
forgotten after the flap window or a clear, messages kept while held,
resets, UNKNOWN/SKIPPED runs, sticky and EVICT codes through clear, precedence with
TESTING, `since`, `judged`, per-entity holdings and the findings of each check's
latest run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checks.base import CheckResult, Severity
from checks.catalog import Catalog, Override, RaiseRule
from healthd.agent import verdict as v
from healthd.kube.conventions import Verdict

from .results import Node, clean, run_of, skipped, unknown

P, W, E, T, X = Verdict.PASS, Verdict.WARN, Verdict.ERR, Verdict.TESTING, Verdict.EVICT

NEEDS_CLEAR = [
    ("remapped", "REMAP_FAILURE"),  # sticky EVICT
    ("xid", "XID_79"),  # sticky EVICT
    ("xid", "XID_95"),  # EVICT, not sticky
    ("gpus", "GPU_MISSING"),  # sticky EVICT
    ("dcgm:3", "DCGM_MEMORY"),  # fatal DCGM test: sticky EVICT
]


@pytest.mark.parametrize(
    ("key", "code", "expected"),
    [
        ("xid", "XID_48", E),  # an event: the next run will not report it again
        ("remapped", "REMAP_PENDING", E),  # a definitive hardware state, not a noisy one
        ("dcgm:1", "DCGM_DIAGNOSTIC", E),  # a diagnostic: the next run may be days away
        ("remapped", "REMAP_FAILURE", X),
        ("xid", "XID_79", X),
        ("gpus", "GPU_MISSING", X),
    ],
)
def test_fatal_codes_events_and_diagnostics_raise_at_once(
    key: str, code: str, expected: Verdict
) -> None:
    node = Node()
    assert node.run(key, run_of(key, (code, 2))) is expected
    top = node.state.top
    assert top is not None
    assert (top.check, top.code, top.entity, top.severity.value) == (key, code, "gpu2", expected)
    assert node.state.since == node.now


@pytest.mark.parametrize(
    ("key", "code", "expected"),
    [
        ("power", "HW_SLOWDOWN", W),
        ("pciebw", "PCIE_BW_LOW", W),
        ("ecc", "ECC_UNCORRECTED", E),
    ],
)
def test_a_steady_signal_raises_on_its_second_consecutive_run(
    key: str, code: str, expected: Verdict
) -> None:
    node = Node()
    faulty = run_of(key, (code, 2))
    assert node.run(key, faulty) is P  # pending: one reading may be noise
    assert [f.code for f in node.state.findings] == [code]
    assert node.run(key, faulty) is expected
    top = node.state.top
    assert top is not None
    assert (top.check, top.code, top.entity, top.severity.value) == (key, code, "gpu2", expected)
    assert node.state.since == node.now


def test_an_event_raises_without_waiting_for_a_schedule() -> None:
    node = Node()
    assert node.run("xid", run_of("xid", ("XID_48", 0)), v.Trigger.EVENT) is E
    assert node.state.checks["xid"].trigger is v.Trigger.EVENT


def test_pass_severity_findings_are_recorded_never_held() -> None:
    node = Node()
    assert node.run("xid", run_of("xid", ("XID_13", 1), ("XID_43", 2))) is P
    assert node.state.held == ()
    assert [f.code for f in node.state.findings] == ["XID_13", "XID_43"]
    assert node.state.judged


@pytest.mark.parametrize("recover_after", [1, 2, 3, 5])
def test_recovery_after_exactly_recover_after_clean_runs(recover_after: int) -> None:
    node = Node(recover_after)
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 1)))
    verdicts = node.runs("remapped", clean("remapped"), recover_after)
    assert verdicts == [E] * (recover_after - 1) + [P]
    assert node.state.held == ()


def test_passes_of_other_checks_never_release_a_holding() -> None:
    node = Node()
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 1)))
    for other in ("power", "pcie", "ecc", "xid", "dcgm:1", "pciebw"):
        assert node.runs(other, clean(other), 5) == [E] * 5
    assert node.holdings() == {("remapped", "REMAP_PENDING", "gpu1")}


def test_a_run_that_reports_the_code_again_resets_the_count() -> None:
    node = Node(recover_after=3)
    faulty = run_of("remapped", ("REMAP_PENDING", 1))
    node.hold("remapped", faulty)
    assert node.runs("remapped", clean("remapped"), 2) == [E, E]
    node.run("remapped", faulty)  # back after two clean runs: a flap, so 3 x 4 now
    assert node.runs("remapped", clean("remapped"), 12) == [E] * 11 + [P]


@pytest.mark.parametrize("blind", [unknown, skipped])
def test_unknown_and_skipped_runs_neither_count_nor_reset(blind) -> None:
    node = Node(recover_after=2)
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 1)))
    assert node.runs("remapped", blind("remapped"), 6) == [E] * 6  # no count
    assert node.run("remapped", clean("remapped")) is E
    assert node.run("remapped", blind("remapped")) is E  # no reset either
    assert node.run("remapped", clean("remapped")) is P


def test_a_run_blind_to_the_holdings_gpu_does_not_count_for_it() -> None:
    node = Node(recover_after=1)
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 3)))
    # gpu3 unreadable; gpu0's new fault makes the run a judgement (status ERR).
    assert node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 0), blind=[3])) is E
    assert node.holdings() == {
        ("remapped", "REMAP_PENDING", "gpu0"),
        ("remapped", "REMAP_PENDING", "gpu3"),
    }
    assert node.run("remapped", clean("remapped")) is P


def test_a_partly_unknown_run_with_a_warning_changes_nothing() -> None:
    node = Node()
    result = run_of("power", ("HW_SLOWDOWN", 0), blind=[1])
    assert result.status is Severity.UNKNOWN
    assert node.run("power", result) is P
    assert node.state.held == ()
    assert not node.state.judged


@pytest.mark.parametrize(("key", "code"), NEEDS_CLEAR)
def test_sticky_and_evict_never_leave_through_runs_alone(key: str, code: str) -> None:
    node = Node(recover_after=1)
    node.run(key, run_of(key, (code, 0)))
    for trigger in v.Trigger:
        assert node.run(key, clean(key), trigger) is X
    assert node.runs(key, clean(key), 30) == [X] * 30


@pytest.mark.parametrize(("key", "code"), NEEDS_CLEAR)
def test_sticky_and_evict_leave_on_clear_and_one_pass(key: str, code: str) -> None:
    node = Node(recover_after=3)
    node.run(key, run_of(key, (code, 0)))
    assert node.clear() == {key}
    assert node.state.verdict is X  # the clear itself releases nothing
    assert node.run(key, clean(key), v.Trigger.CLEAR) is P


def test_a_sticky_code_overridden_to_err_still_needs_a_clear() -> None:
    sticky = Catalog({"REMAP_PENDING": Override(sticky=True)})
    node = Node(recover_after=1)
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 0), catalog=sticky))
    assert node.runs("remapped", clean("remapped"), 10) == [E] * 10
    node.clear()
    assert node.run("remapped", clean("remapped")) is P


def test_a_failing_rerun_spends_the_clear() -> None:
    node = Node()
    faulty = run_of("remapped", ("REMAP_FAILURE", 0))
    node.run("remapped", faulty)
    node.clear()
    assert node.run("remapped", faulty, v.Trigger.CLEAR) is X
    assert node.runs("remapped", clean("remapped"), 5) == [X] * 5
    node.clear()
    assert node.run("remapped", clean("remapped")) is P


def test_an_unknown_rerun_keeps_the_clear_pending() -> None:
    node = Node()
    node.run("xid", run_of("xid", ("XID_79", 1)))
    node.clear()
    assert node.run("xid", unknown("xid"), v.Trigger.CLEAR) is X
    assert node.run("xid", clean("xid")) is P


def test_a_clear_on_a_node_holding_nothing_changes_nothing() -> None:
    node = Node()
    node.run("remapped", clean("remapped"))
    before = node.state
    assert node.clear() == frozenset()
    assert node.state is before


def test_a_clear_names_every_check_that_holds_anything() -> None:
    node = Node()
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 0)))
    node.run("remapped", run_of("remapped", ("REMAP_FAILURE", 1)))
    node.run("dcgm:3", run_of("dcgm:3", ("DCGM_PCIE", 2)))
    node.run("ecc", clean("ecc"))
    assert node.clear() == {"power", "remapped", "dcgm:3"}
    assert all(h.clear_requested for h in node.state.held)


def test_a_clear_releases_a_plain_err_on_one_pass() -> None:
    node = Node(recover_after=5)
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 0)))
    node.clear()
    assert node.run("remapped", clean("remapped")) is P


def test_a_clear_only_marks_holdings_present_at_the_time() -> None:
    node = Node()
    node.run("remapped", run_of("remapped", ("REMAP_FAILURE", 0)))
    node.clear()
    node.run("xid", run_of("xid", ("XID_79", 1)))  # after the clear
    node.run("remapped", clean("remapped"))
    assert node.run("xid", clean("xid")) is X
    assert node.holdings() == {("xid", "XID_79", "gpu1")}


HOLDS = {
    "WARN": ("power", "HW_SLOWDOWN"),
    "ERR": ("remapped", "REMAP_PENDING"),
    "EVICT": ("xid", "XID_79"),
}


@pytest.mark.parametrize(
    ("holds", "testing", "expected"),
    [
        ((), False, P),
        ((), True, T),
        (("WARN",), False, W),
        (("WARN",), True, T),
        (("ERR",), False, E),
        (("ERR",), True, E),
        (("ERR", "WARN"), True, E),
        (("EVICT",), True, X),
        (("EVICT", "ERR", "WARN"), False, X),
        (("EVICT", "ERR", "WARN"), True, X),
    ],
)
def test_precedence_evict_err_testing_warn_pass(
    holds: tuple[str, ...], testing: bool, expected: Verdict
) -> None:
    node = Node()
    for name in holds:
        key, code = HOLDS[name]
        node.hold(key, run_of(key, (code, 0)))
    if testing:
        node.start("dcgm:3")
    assert node.state.verdict is expected
    assert node.state.verdict is v.verdict_of(node.state.held, node.state.testing)
    if holds:
        top = node.state.top
        assert top is not None and top.severity.value == holds[0]


def test_start_and_end_testing_return_to_the_verdict_before() -> None:
    node = Node()
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 0)))
    assert node.start("dcgm:3") is T
    assert node.start("dcgm:3") is T  # idempotent
    assert node.start("dcgm:4") is T
    assert node.end("dcgm:3") is T  # dcgm:4 still holds the GPUs
    assert node.end("dcgm:4") is W
    before = node.state
    assert node.end("dcgm:4") is W
    assert node.state is before


def test_a_periodic_run_never_downgrades_testing() -> None:
    node = Node(recover_after=1)
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 0)))
    node.start("dcgm:3")
    assert node.run("power", clean("power")) is T  # the WARN recovered underneath
    assert node.state.held == ()
    assert node.run("dcgm:3", clean("dcgm:3"), v.Trigger.ON_DEMAND) is T
    assert node.end("dcgm:3") is P


def test_since_moves_only_when_the_verdict_changes() -> None:
    node = Node()
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 0)))
    raised = node.state.since
    node.run("remapped", run_of("remapped", ("REMAP_PENDING", 0)))
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 1)))
    node.run("remapped", unknown("remapped"))
    node.clear()
    node.start("dcgm:3")
    node.end("dcgm:3")
    assert (node.state.verdict, node.state.since) == (E, raised)
    node.runs("remapped", clean("remapped"), 1)  # the clear lets it go on one pass
    assert (node.state.verdict, node.state.since) == (W, node.now)


def test_judged_only_after_a_judgement() -> None:
    node = Node()
    assert not node.state.judged
    node.run("remapped", unknown("remapped"))
    node.run("pcie", skipped("pcie"))
    node.start("dcgm:3")
    assert not node.state.judged
    node.end("dcgm:3")
    node.run("ecc", clean("ecc"))
    assert node.state.judged
    node.run("ecc", unknown("ecc"))
    assert node.state.judged


def test_the_same_code_on_two_gpus_is_two_holdings() -> None:
    node = Node()
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 1), ("REMAP_PENDING", 3)))
    assert node.holdings() == {
        ("remapped", "REMAP_PENDING", "gpu1"),
        ("remapped", "REMAP_PENDING", "gpu3"),
    }
    only3 = run_of("remapped", ("REMAP_PENDING", 3))
    assert node.runs("remapped", only3, 2) == [E, E]
    assert node.holdings() == {("remapped", "REMAP_PENDING", "gpu3")}


def test_two_keys_of_one_check_hold_separately() -> None:
    node = Node(recover_after=1)
    node.run("dcgm:3", run_of("dcgm:3", ("DCGM_DIAGNOSTIC", 0)))
    assert node.run("dcgm:1", clean("dcgm:1")) is E
    assert node.run("dcgm:3", clean("dcgm:3")) is P


def test_findings_show_each_checks_latest_run() -> None:
    node = Node()
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 0)))
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 1)))
    node.run("remapped", run_of("remapped", ("REMAP_PENDING", 2)))
    assert {(f.code, f.entity.label) for f in node.state.findings} == {
        ("REMAP_PENDING", "gpu2"),
        ("HW_SLOWDOWN", "gpu1"),
    }
    node.run("power", unknown("power"))
    assert [f.entity.label for f in node.state.findings] == ["gpu2"]
    # The held gpu0 fault is still what keeps the node at ERR.
    assert ("remapped", "REMAP_PENDING", "gpu0") in node.holdings()


def test_the_last_run_of_each_check_is_recorded() -> None:
    node = Node()
    node.run("ecc", unknown("ecc"), v.Trigger.ON_DEMAND)
    state = node.state.checks["ecc"]
    assert (state.status, state.trigger, state.at) == (Severity.UNKNOWN, "on-demand", node.now)
    assert "timed out" in state.reason


def test_holdings_are_ordered_worst_first() -> None:
    node = Node()
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 0)))
    node.hold("remapped", run_of("remapped", ("REMAP_PENDING", 1)))
    node.run("xid", run_of("xid", ("XID_79", 2)))
    assert [h.severity for h in node.state.held] == [Severity.EVICT, Severity.ERR, Severity.WARN]


def test_recover_after_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="recover_after"):
        v.Policy(recover_after=0)


def test_two_sightings_in_three_runs_raise() -> None:
    node = Node()
    faulty = run_of("power", ("HW_SLOWDOWN", 0))
    assert [node.run("power", r) for r in (faulty, clean("power"), faulty)] == [P, P, W]


@pytest.mark.parametrize("gap", [2, 3, 9])
def test_sightings_further_apart_never_raise(gap: int) -> None:
    node = Node()
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    for _ in range(20):
        assert node.run("power", faulty) is P
        assert node.runs("power", ok, gap) == [P] * gap
    assert node.state.held == ()
    assert node.state.flaps_total == 19  # every sighting after the first was a swing


def test_a_wider_rule_from_the_catalog_raises_on_the_third_sighting() -> None:
    rule = Catalog({"HW_SLOWDOWN": Override(raise_rule=RaiseRule(3, 5))})
    node = Node(catalog=rule)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0), catalog=rule), clean("power")
    assert [node.run("power", r) for r in (faulty, ok, faulty, ok, faulty)] == [P, P, P, P, W]
    node = Node(catalog=rule)
    assert node.runs("power", faulty, 2) == [P, W]  # two consecutive runs raise whatever the rule


def test_runs_of_other_checks_and_blind_runs_do_not_count_as_sightings() -> None:
    node = Node()
    faulty = run_of("power", ("HW_SLOWDOWN", 0))
    assert node.run("power", faulty) is P
    node.runs("remapped", clean("remapped"), 3)
    node.run("power", unknown("power"))
    node.run("power", run_of("power", blind=[0]))
    assert node.run("power", faulty) is W  # still the second consecutive sighting


def test_a_returning_finding_is_held_four_times_as_long_each_time() -> None:
    node = Node(recover_after=1, max_doublings=8)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    holds = []
    for _ in range(4):
        node.hold("power", faulty)
        verdicts = []
        while node.run("power", ok) is W:
            verdicts.append(W)
        holds.append(len(verdicts) + 1)
    # 1 x 4^flaps (each silence was a hold's length, so twice it never beats that)
    assert holds == [1, 4, 16, 64]
    assert node.state.flaps_total == 3
    assert node.state.tracks[("power", "HW_SLOWDOWN", "gpu0")].flaps == 3


def test_a_finding_is_held_twice_its_longest_silence() -> None:
    node = Node(recover_after=1, max_doublings=5)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    node.hold("power", faulty)
    assert node.runs("power", ok, 1) == [P]  # no flap yet: recover_after
    assert node.runs("power", ok, 9) == [P] * 9  # a silence of 10 runs
    assert node.hold("power", faulty) is W  # back: 1 flap (x4), but silent 10 runs
    assert node.state.top is not None and node.state.top.gap == 10
    assert node.runs("power", ok, 20) == [W] * 19 + [P]  # 2 x 10, not 1 x 4


def test_a_long_silence_is_still_capped() -> None:
    node = Node(recover_after=1, max_doublings=3)  # capped at 1 x 2^3 = 8
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    node.hold("power", faulty)
    node.runs("power", ok, 30)
    node.hold("power", faulty)
    assert node.runs("power", ok, 8) == [W] * 7 + [P]


def test_a_new_holding_lasts_at_least_min_hold_runs() -> None:
    node = Node(recover_after=2, min_hold=6)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    assert node.hold("power", faulty) is W  # raised on its second sighting
    assert node.runs("power", ok, 6) == [W] * 5 + [P]  # 6 runs after the raise, not 2


def test_a_fault_that_outlasts_min_hold_is_released_after_recover_after() -> None:
    node = Node(recover_after=2, min_hold=6)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    node.hold("power", faulty)
    node.runs("power", faulty, 4)  # a steady fault, 6 runs in all
    assert node.runs("power", ok, 2) == [W, P]  # a genuine recovery is not slowed


def test_min_hold_counts_only_runs_that_could_see_the_holding() -> None:
    node = Node(recover_after=1, min_hold=4)
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 0)))
    assert node.runs("power", unknown("power"), 5) == [W] * 5
    assert node.runs("power", run_of("power", blind=[0]), 5) == [W] * 5
    assert node.runs("power", clean("power"), 4) == [W] * 3 + [P]


def test_a_clear_does_not_wait_for_min_hold() -> None:
    node = Node(recover_after=2, min_hold=6)
    node.hold("power", run_of("power", ("HW_SLOWDOWN", 0)))
    node.clear()
    assert node.run("power", clean("power")) is P


def test_the_hold_is_capped() -> None:
    node = Node(recover_after=1, max_doublings=3)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    for _ in range(6):
        node.hold("power", faulty)
    held = node.state.top
    assert held is not None and held.flaps == 0  # renewals are not flaps
    for _ in range(5):
        node.runs("power", ok, 1)
        node.hold("power", faulty)
    held = node.state.top
    assert held is not None and held.flaps == 2  # counted up to where the hold stops growing
    assert node.state.tracks[held.key].flaps == 5
    assert node.runs("power", ok, 8) == [W] * 7 + [P]  # 1 x 2^3, not 1 x 4^5


def test_flaps_are_forgotten_after_the_flap_window() -> None:
    node = Node(recover_after=1, flap_window=10)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    node.hold("power", faulty)
    node.run("power", ok)
    node.hold("power", faulty)
    assert node.state.top is not None and node.state.top.flaps == 1
    node.runs("power", ok, 2 + 10)
    node.hold("power", faulty)
    assert node.state.top is not None and node.state.top.flaps == 0
    assert node.runs("power", ok, 1) == [P]


def test_a_clear_starts_the_flap_count_over() -> None:
    node = Node(recover_after=1)
    faulty, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    node.hold("power", faulty)
    node.run("power", ok)
    node.hold("power", faulty)
    assert node.state.top is not None and node.state.top.flaps == 1
    node.clear()
    node.run("power", ok)
    node.hold("power", faulty)
    assert node.state.top is not None and node.state.top.flaps == 1  # not 2


def test_a_signal_that_keeps_coming_back_is_held_longer_before_it_is_ever_raised() -> None:
    node = Node(recover_after=2)
    blip, ok = run_of("power", ("HW_SLOWDOWN", 0)), clean("power")
    for _ in range(3):  # single blips: never raised, but each one is a swing
        assert [node.run("power", r) for r in (blip, ok, ok)] == [P, P, P]
    assert node.hold("power", blip) is W
    held = node.state.top
    assert held is not None and held.flaps == 3  # the second and third blip, and this one
    assert node.runs("power", ok, 64) == [W] * 63 + [P]  # 2 x 4^3, capped at 2 x 2^5


def test_a_held_finding_keeps_its_message_while_its_value_moves() -> None:
    node = Node()
    replays = run_of("pcie", ("PCIE_REPLAYS", 1))
    for count in range(6):
        node.run("pcie", _with_message(replays, f"replay counter +{count}"))
    top = node.state.top
    assert top is not None and top.message == "replay counter +1"  # as raised
    assert node.state.findings[0].message == "replay counter +5"  # the latest run's


def _with_message(result: CheckResult, message: str) -> CheckResult:
    findings = tuple(replace(f, message=message) for f in result.findings)
    return replace(result, findings=findings)
