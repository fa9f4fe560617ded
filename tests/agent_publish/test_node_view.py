"""What the node should show for a state (pure): the label only once judged, the
health annotation's content and its size bound with many findings, the condition."""

from __future__ import annotations

import json

from checks.base import CheckResult, Entity, ResultBuilder
from checks.catalog import Catalog
from healthd.agent import verdict as v
from healthd.agent.node_view import HEALTH_LIMIT, desired_from, health_json
from healthd.agent.verdict import Policy, Trigger, apply, initial, start_testing
from healthd.kube.conventions import Reason, dcgm_label_value
from tests.agent_publish.conftest import KEYS, NODE, finding, judged, result

RANKS = {"EVICT": 3, "ERR": 2, "WARN": 1, "PASS": 0}
XID_CODES = [8, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120]


def many_findings_state():
    """8 GPUs, each with every kind of finding several checks can report."""
    runs = []
    for check, codes in (("xid", [f"XID_{x}" for x in XID_CODES]),
                         ("remapped", ["REMAP_PENDING", "REMAP_FAILURE"]),
                         ("pcie", ["PCIE_LINK_DEGRADED", "PCIE_REPLAYS"]),
                         ("ecc", ["ECC_UNCORRECTED", "PAGES_PENDING"]),
                         ("power", ["HW_SLOWDOWN"]), ("nvlink", ["NVLINK_DOWN"])):
        found = [finding(code, gpu, f"{code} on this GPU: " + "detail " * 20)
                 for gpu in range(8) for code in codes]
        runs.append((check, result(check, *found)))
    return judged(*runs)


def test_health_annotation_stays_under_the_bound_and_keeps_the_worst() -> None:
    state = many_findings_state()
    text = health_json(state)
    assert len(text.encode()) <= HEALTH_LIMIT
    body = json.loads(text)
    assert body["verdict"] == "EVICT" and body["top"] == state.top.code
    assert body["truncated"] > 0
    kept = body["held"] + body["findings"]
    held_slots = {(h.check, h.code, h.entity) for h in state.held}
    everything = [h.severity.rank for h in state.held] + [
        f.severity.rank for key, found in state.check_findings.items() for f in found
        if (key, f.code, f.entity.label) not in held_slots]
    assert len(kept) + body["truncated"] == len(everything)
    # Least severe dropped first: what is kept is the most severe part of everything.
    kept_ranks = sorted((RANKS[item["severity"]] for item in kept), reverse=True)
    assert kept_ranks == sorted(everything, reverse=True)[: len(kept)]
    assert {e["code"] for e in body["held"]} >= {"XID_79", "REMAP_FAILURE"}
    assert set(body["checks"]) == {"xid", "remapped", "pcie", "ecc", "power", "nvlink"}


def test_small_state_is_complete_without_truncation() -> None:
    state = judged(("remapped", result("remapped", finding("REMAP_PENDING", 2, "2 rows"))),
                   ("xid", result("xid", finding("XID_13", 1, "XID 13: graphics engine"))))
    body = json.loads(health_json(state))
    assert "truncated" not in body
    (held,) = body["held"]
    assert held["code"] == "REMAP_PENDING" and held["entity"] == "gpu2"
    assert held["check"] == "remapped" and held["severity"] == "ERR"
    assert held["uuid"].startswith("GPU-00000002")
    assert [f["code"] for f in body["findings"]] == ["XID_13"]  # recorded, not held
    assert body["checks"]["remapped"]["status"] == "ERR"


def test_label_only_once_judged_and_dcgm_labels_from_the_caller() -> None:
    value = dcgm_label_value(False, 1_750_000_000)
    unjudged = desired_from(initial(0), KEYS, node=NODE, dcgm_levels={3: value})
    assert unjudged.labels == {KEYS.dcgm_level(3): value}
    assert unjudged.condition["status"] == "Unknown"
    assert unjudged.condition["reason"] == Reason.CANNOT_JUDGE
    ok = desired_from(judged(("remapped", result("remapped"))), KEYS, node=NODE, dcgm_levels={},
                      last_run='{"id":"x"}')
    assert ok.labels == {KEYS.gpuhealth: "PASS"}
    assert ok.annotations[KEYS.last_run] == '{"id":"x"}'
    assert "lastTransitionTime" not in ok.condition


def test_testing_verdict_condition_is_false_with_diagnostic_reason() -> None:
    state = start_testing(judged(("remapped", result("remapped"))), "dcgm:3", at=1.0)
    cond = desired_from(state, KEYS, node=NODE, dcgm_levels={}).condition
    assert (cond["status"], cond["reason"]) == ("False", Reason.TESTING)
    assert "dcgm:3" in cond["message"]


def test_ping_view_for_fleet_blame() -> None:
    """The health annotation says which peers this node holds unreachable, or that it
    holds itself isolated, for the controller's fleet-wide blame: what the verdict
    machine holds, so a single missed round is no news and a held peer stays listed
    until it is released. It names the peers it reached, since it probes a bounded
    set (healthd.blame.peersets): a peer new to the set that does not answer is not
    reached (its finding is pending), one already probed stays reached through a
    single miss, and a peer no longer in the set is no longer named."""
    def ping(unreachable: list[str], isolated: bool = False,
             peers: tuple[str, ...] = ("n2", "n3", "n4")) -> CheckResult:
        builder = ResultBuilder("ping", Catalog())
        for peer in peers:
            entity = Entity("peer", peer)
            if peer in unreachable and not isolated:
                builder.finding("PEER_UNREACHABLE", entity, f"{peer} does not answer")
            elif isolated:  # as checks.ping says it: from a cut-off node, not judged
                builder.seen(entity)
                builder.unknown(entity, "not judged: this node cannot reach most of its peers")
            else:
                builder.seen(entity)
        if isolated:
            builder.finding("NETWORK_ISOLATED", Entity.node("n1"), "cannot reach its peers")
        return builder.build()

    def rounds(*results: CheckResult) -> dict[str, object]:
        state = v.initial()
        for at, ran in enumerate(results, start=1):
            state = v.apply(state, "ping", ran, trigger=v.Trigger.PERIODIC,
                            at=10.0 * at, policy=v.Policy())
        return dict(json.loads(health_json(state))["ping"])

    assert "ping" not in json.loads(health_json(v.initial()))
    missed = ping(["n3"])
    both = ["n2", "n4"]
    assert rounds(missed) == {"isolated": False, "unreached": [], "reached": both}  # pending
    assert rounds(missed, missed) == {"isolated": False, "unreached": ["n3"],
                                      "reached": both}  # held
    answered = [ping([])] * 6
    assert rounds(missed, missed, *answered[:1])["unreached"] == ["n3"]  # still held
    assert rounds(missed, missed, *answered) == {
        "isolated": False, "unreached": [], "reached": ["n2", "n3", "n4"]}  # released
    assert rounds(ping([]), missed)["reached"] == ["n2", "n3", "n4"]  # one miss: no news
    rotated = ping([], peers=("n5", "n6"))
    assert rounds(ping([]), rotated)["reached"] == ["n5", "n6"]
    alone = ping([], isolated=True)
    assert rounds(alone)["isolated"] is False
    assert rounds(alone, alone) == {"isolated": True, "unreached": ["n2", "n3", "n4"],
                                    "reached": []}


def test_a_pending_finding_is_not_published_until_it_is_raised() -> None:
    slowdown = ("power", result("power", finding("HW_SLOWDOWN", 1, "clocks at 1410 MHz")))
    once = apply(initial(1000.0), *slowdown, trigger=Trigger.PERIODIC, at=1000.0,
                 policy=Policy())
    assert [f.code for f in once.findings] == ["HW_SLOWDOWN"]  # seen by `healthd check`
    body = json.loads(health_json(once))
    assert (body["verdict"], body["held"], body["findings"]) == ("PASS", [], [])
    assert body["checks"]["power"]["status"] == "PASS"  # what it holds: nothing yet
    twice = apply(once, *slowdown, trigger=Trigger.PERIODIC, at=1030.0, policy=Policy())
    body = json.loads(health_json(twice))
    assert body["verdict"] == "WARN" and body["checks"]["power"]["status"] == "WARN"
    assert [h["code"] for h in body["held"]] == ["HW_SLOWDOWN"]


def test_a_held_finding_says_what_the_repair_needs_and_a_healthy_node_does_not() -> None:
    bad = judged(("xid", result("xid", finding("XID_79", 5, "GPU has fallen off the bus"))))
    cond = desired_from(bad, KEYS, node=NODE, dcgm_levels={},
                        repair_note="reboot needed").condition
    assert (cond["status"], cond["reason"]) == ("True", "XID_79")
    assert cond["message"].endswith("; repair: reboot needed")
    assert "fallen off the bus" in cond["message"]
    ok = judged(("remapped", result("remapped")))
    cond = desired_from(ok, KEYS, node=NODE, dcgm_levels={}, repair_note="reboot needed").condition
    assert "repair" not in cond["message"]
