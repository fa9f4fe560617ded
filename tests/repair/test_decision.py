"""The repair decision (healthd.repair.decision): one next step per node from its held
findings, its repair history and the cluster's guards. A table of the situations an
SRE meets, then the rules no situation may break (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from healthd.config import Config
from healthd.published import Holding
from healthd.repair.decision import (
    DEFAULT_REMEDIES,
    Attempt,
    Decision,
    Finding,
    Policy,
    Remedy,
    Situation,
    Step,
    decide,
    findings_of,
)

NOW = 1_800_000_000.0
DAY = 86400.0
GPU3, GPU5 = "GPU-3333", "GPU-5555"
POLICY = Policy()


def situation(*findings: Finding, **kw: object) -> Situation:
    return Situation(findings=findings, now=NOW, **kw)  # type: ignore[arg-type]


def resets(n: int, ago: float = 3600) -> tuple[Attempt, ...]:
    return tuple(Attempt(Remedy.RESET, NOW - ago - i, (GPU3,)) for i in range(n))


def reboots(n: int, ago: float = 3600) -> tuple[Attempt, ...]:
    return tuple(Attempt(Remedy.REBOOT, NOW - ago - i) for i in range(n))


CASES: list[tuple[str, Situation, Step, tuple[str, ...]]] = [
    ("healthy node", situation(), Step.NOTHING, ()),
    ("a finding no repair is for (a NIC down)", situation(Finding("NIC_DOWN")), Step.NOTHING, ()),
    ("pending remap, GPUs idle", situation(Finding("REMAP_PENDING", GPU3)),
     Step.RESET_GPUS, (GPU3,)),
    ("the driver asks for a GPU reset on two GPUs",
     situation(Finding("RECOVERY_GPU_RESET", GPU5), Finding("PAGES_PENDING", GPU3)),
     Step.RESET_GPUS, (GPU3, GPU5)),
    ("only the GPUs that need it are reset",
     situation(Finding("REMAP_PENDING", GPU3), Finding("NIC_DOWN")), Step.RESET_GPUS, (GPU3,)),
    ("pending remap under a running job", situation(Finding("REMAP_PENDING", GPU3),
                                                    pods_on_gpus=2), Step.WAIT, ()),
    ("GPU fell off the bus", situation(Finding("XID_79", GPU3)), Step.REBOOT, ()),
    ("the driver asks for a reboot", situation(Finding("RECOVERY_NODE_REBOOT", GPU3)),
     Step.REBOOT, ()),
    ("a reboot subsumes a reset", situation(Finding("REMAP_PENDING", GPU3),
                                            Finding("GPU_MISSING")), Step.REBOOT, ()),
    ("a reset-class finding on no GPU needs a reboot", situation(Finding("XID_95")),
     Step.REBOOT, ()),
    ("a failed remap goes to humans", situation(Finding("REMAP_FAILURE", GPU3)),
     Step.HARDWARE_INSPECTION, ()),
    ("survived two resets: a reboot", situation(Finding("REMAP_PENDING", GPU3),
                                                history=resets(2)), Step.REBOOT, ()),
    ("one reset so far: another reset", situation(Finding("REMAP_PENDING", GPU3),
                                                  history=resets(1)), Step.RESET_GPUS, (GPU3,)),
    ("resets outside the window do not count",
     situation(Finding("REMAP_PENDING", GPU3), history=resets(2, ago=2 * DAY)),
     Step.RESET_GPUS, (GPU3,)),
    ("survived two reboots: hardware inspection",
     situation(Finding("XID_79", GPU3), history=reboots(2)), Step.HARDWARE_INSPECTION, ()),
    ("survived resets and reboots: hardware inspection",
     situation(Finding("REMAP_PENDING", GPU3), history=resets(2) + reboots(2)),
     Step.HARDWARE_INSPECTION, ()),
    ("in inspection: nothing more, whatever the findings",
     situation(Finding("REMAP_PENDING", GPU3), in_inspection=True),
     Step.HARDWARE_INSPECTION, ()),
    ("in inspection stays even once the findings are gone",
     situation(in_inspection=True), Step.HARDWARE_INSPECTION, ()),
    ("opted out", situation(Finding("REMAP_PENDING", GPU3), opted_out=True), Step.HELD, ()),
    ("cordoned by someone else", situation(Finding("XID_79", GPU3), foreign_cordon=True),
     Step.HELD, ()),
    ("breaker open", situation(Finding("REMAP_PENDING", GPU3), breaker_open=True),
     Step.HELD, ()),
    ("opted out even with a budget spent",
     situation(Finding("XID_79", GPU3), history=reboots(5), opted_out=True), Step.HELD, ()),
]


@pytest.mark.parametrize(("what", "given_", "step", "gpus"), CASES,
                         ids=[c[0] for c in CASES])
def test_the_decision_for_each_situation(what: str, given_: Situation, step: Step,
                                         gpus: tuple[str, ...]) -> None:
    decision = decide(given_, POLICY)
    assert (decision.step, decision.gpus) == (step, gpus), decision.reason
    assert decision.reason


def test_the_held_reasons_say_which_guard() -> None:
    finding = Finding("REMAP_PENDING", GPU3)
    reasons = [decide(situation(finding, **{k: True}), POLICY).reason  # type: ignore[arg-type]
               for k in ("opted_out", "foreign_cordon", "breaker_open")]
    assert "exclude-from-remediation" in reasons[0]
    assert "cordoned" in reasons[1]
    assert "breaker" in reasons[2]


def test_the_config_overrides_a_remedy_and_the_budgets() -> None:
    policy = Policy(remedies={**DEFAULT_REMEDIES, "REMAP_PENDING": Remedy.REBOOT,
                              "NIC_DOWN": Remedy.HUMANS, "XID_79": None},
                    max_gpu_resets=0, max_reboots=1)
    assert decide(situation(Finding("REMAP_PENDING", GPU3)), policy).step is Step.REBOOT
    assert decide(situation(Finding("NIC_DOWN")), policy).step is Step.HARDWARE_INSPECTION
    assert decide(situation(Finding("XID_79", GPU3)), policy).step is Step.NOTHING
    assert decide(situation(Finding("PAGES_PENDING", GPU3)), policy).step is Step.REBOOT
    assert decide(situation(Finding("PAGES_PENDING", GPU3), history=reboots(1)),
                  policy).step is Step.HARDWARE_INSPECTION


def test_published_holdings_become_findings_once_each() -> None:
    def held(code: str, entity: str, uuid: str, check: str = "remapped") -> Holding:
        return Holding(code, check, entity, "ERR", False, "m", "2026-11-26T00:00:00Z", uuid)

    found = findings_of([held("REMAP_PENDING", "gpu3", GPU3),
                         held("REMAP_PENDING", "gpu3", GPU3, check="remapped:again"),
                         held("NIC_DOWN", "nic/net1", "", check="nic")])
    assert found == (Finding("REMAP_PENDING", GPU3), Finding("NIC_DOWN"))


codes = st.sampled_from([*DEFAULT_REMEDIES, "NIC_DOWN", "PEER_UNREACHABLE", "XID_13"])
findings = st.lists(st.builds(Finding, codes, st.sampled_from(["", GPU3, GPU5])), max_size=5)
attempts = st.lists(st.builds(Attempt, st.sampled_from([Remedy.RESET, Remedy.REBOOT]),
                              st.floats(NOW - 3 * DAY, NOW), st.just(()),
                              st.sampled_from(["passed", "failed", "refused", "timed-out"]),
                              st.floats(NOW - 3 * DAY, NOW)), max_size=6)
situations = st.builds(Situation, findings.map(tuple), st.just(NOW), attempts.map(tuple),
                       st.booleans(), st.integers(0, 3), st.booleans(), st.booleans(),
                       st.booleans())


def _acts(decision: Decision) -> bool:
    return decision.step in (Step.RESET_GPUS, Step.REBOOT)


@given(situations)
def test_no_repair_while_a_guard_holds_or_work_runs(s: Situation) -> None:
    decision = decide(s, POLICY)
    if s.opted_out or s.foreign_cordon or s.breaker_open or s.pods_on_gpus or s.in_inspection:
        assert not _acts(decision)


@given(situations)
def test_the_budget_is_never_exceeded(s: Situation) -> None:
    decision = decide(s, POLICY)
    recent = [a for a in s.history if NOW - a.at < POLICY.window_s and a.outcome != "refused"]
    if decision.step is Step.RESET_GPUS:
        assert sum(a.remedy is Remedy.RESET for a in recent) < POLICY.max_gpu_resets
        assert set(decision.gpus) <= {f.uuid for f in s.findings}
    if decision.step is Step.REBOOT:
        assert sum(a.remedy is Remedy.REBOOT for a in recent) < POLICY.max_reboots


@given(situations)
def test_no_attempt_follows_an_unsuccessful_one_before_its_pause(s: Situation) -> None:
    decision = decide(s, POLICY)
    last = s.history[-1] if s.history else None
    if _acts(decision) and last is not None and last.outcome != "passed" and last.ended:
        assert NOW - last.ended >= POLICY.pause_s
    if decision.retry_at is not None:
        assert decision.step is Step.WAIT and decision.retry_at > NOW


@given(situations)
def test_a_gpu_is_named_once_in_a_reset(s: Situation) -> None:
    decision = decide(s, POLICY)
    assert len(set(decision.gpus)) == len(decision.gpus)


@given(situations)
def test_a_node_without_repairable_findings_is_left_alone(s: Situation) -> None:
    if not s.in_inspection and not any(f.code in DEFAULT_REMEDIES for f in s.findings):
        assert decide(s, POLICY).step is Step.NOTHING


def test_the_config_section_becomes_the_policy() -> None:
    config = Config.model_validate({"controller": {"repair": {
        "remedies": {"XID_48": "reboot", "REMAP_PENDING": "none"}, "max_reboots": 1,
        "window": "12h"}}})
    policy = Policy.from_settings(config.controller.repair)
    assert decide(situation(Finding("XID_48", GPU3)), policy).step is Step.REBOOT
    assert decide(situation(Finding("REMAP_PENDING", GPU3)), policy).step is Step.NOTHING
    assert decide(situation(Finding("XID_79", GPU3), history=reboots(1)),
                  policy).step is Step.HARDWARE_INSPECTION
    assert policy.window_s == 12 * 3600


@pytest.mark.parametrize("repair", [{"remedies": {"NOT_A_CODE": "reset"}},
                                    {"remedies": {"XID_79": "replace"}},
                                    {"max_gpu_resets": -1}])
def test_a_broken_repair_section_is_refused_with_the_field(repair: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        Config.model_validate({"controller": {"repair": repair}})
    assert "repair" in str(info.value)


def ended(outcome: str, ago: float, remedy: Remedy = Remedy.RESET, note: str = "") -> Attempt:
    return Attempt(remedy, NOW - ago - 30, (GPU3,), outcome, NOW - ago, note)


def test_a_gpu_with_two_findings_a_reset_clears_is_reset_once() -> None:
    decision = decide(situation(Finding("REMAP_PENDING", GPU3), Finding("XID_48", GPU3)), POLICY)
    assert decision.step is Step.RESET_GPUS and decision.gpus == (GPU3,)


def test_refused_resets_are_not_spent_from_the_budget() -> None:
    refused = (ended("refused", 7200), ended("refused", 3600))
    decision = decide(situation(Finding("REMAP_PENDING", GPU3), history=refused), POLICY)
    assert decision.step is Step.RESET_GPUS  # two failed resets would mean a reboot


def test_resets_refused_too_often_hold_the_node_naming_what_held_the_gpus() -> None:
    note = "nothing was reset: GPU-3333 refused: held by pid 4242 (nv-hostengine)"
    refused = tuple(ended("refused", 3600 * (3 - i), note=note) for i in range(3))
    decision = decide(situation(Finding("REMAP_PENDING", GPU3), history=refused), POLICY)
    assert decision.step is Step.HELD
    assert "refused 3 time(s) in a row" in decision.reason and "nv-hostengine" in decision.reason


@pytest.mark.parametrize(("history", "pause"), [
    ((ended("failed", 10),), 60.0),
    ((ended("refused", 10),), 60.0),
    ((ended("failed", 4000), ended("refused", 10)), 120.0),
    ((ended("failed", 9000), ended("failed", 8000, Remedy.REBOOT), ended("timed-out", 10)),
     240.0),
], ids=["after a failure", "after a refusal", "two in a row", "three in a row"])
def test_the_next_attempt_waits_a_pause_that_grows(history: tuple[Attempt, ...],
                                                   pause: float) -> None:
    policy = Policy(max_gpu_resets=9, max_reboots=9)
    decision = decide(situation(Finding("REMAP_PENDING", GPU3), history=history), policy)
    assert decision.step is Step.WAIT and decision.retry_at == NOW - 10 + pause
    later = Situation(findings=(Finding("REMAP_PENDING", GPU3),), now=NOW - 10 + pause,
                      history=history)
    assert decide(later, policy).step is Step.RESET_GPUS


def test_a_passed_attempt_needs_no_pause() -> None:
    decision = decide(situation(Finding("REMAP_PENDING", GPU3), history=(ended("passed", 5),)),
                      POLICY)
    assert decision.step is Step.RESET_GPUS
