"""What keeps healthd's repairs off a node, on the real control plane: the medik8s
opt-out label, a cordon someone else set, an open reset breaker (several nodes failing
at once beyond its threshold) and `dry_run`. Each node gets no GPU-reset Job and its
GPUs are not touched; the node says why (its `healthd.io/repair` annotation, one
`RepairHeld` Event); in dry run nothing is written at all, and the controller's metric
and log say what it would have done."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.healthd import Healthd, eventually
from tests.e2e.repairs import OPT_OUT, RepairFleet, repair_fleet, watching

# Two bad nodes tolerated, counted over a window longer than the test: the first two
# (the opted-out and the cordoned one) keep it closed, the next two open it.
BREAKER: dict[str, object] = {"controller": {"breaker": {"max_unhealthy": "2",
                                                        "window": "10m"}}}
HELD_S = 60


def held_for(fleet: RepairFleet, node: str, why: str) -> None:
    """Until `node`'s repair is held for `why` and says so in one Event."""
    eventually(lambda: fleet.state(node) == "held", HELD_S, f"{node} held")
    doc = fleet.repair(node)
    assert doc is not None and why in doc["reason"], doc
    eventually(lambda: fleet.events(node, "RepairHeld") == 1, 30, f"the Event on {node}")


def test_opted_out_cordoned_and_breaker_held_nodes_are_not_repaired_and_say_why(
        healthd: Healthd, tmp_path: Path) -> None:
    with repair_fleet(healthd, tmp_path, 4, config=BREAKER, tag="guard") as fleet:
        opted_out, cordoned, *mass = fleet.nodes
        healthd.core.patch_node(opted_out, {"metadata": {"labels": {OPT_OUT: "true"}}})
        healthd.core.patch_node(cordoned, {"spec": {"unschedulable": True}})
        with watching(fleet, fleet.nodes) as seen:
            fleet.remap_pending(opted_out)
            fleet.remap_pending(cordoned)
            held_for(fleet, opted_out, f"labelled {OPT_OUT}=true")
            held_for(fleet, cordoned, "cordoned by someone else")
            assert fleet.metric("healthd_controller_breaker_open") == 0

            for node in mass:  # together: four of four bad, two tolerated
                fleet.remap_pending(node)
            for node in mass:
                held_for(fleet, node, "breaker is open")
            eventually(lambda: fleet.metric("healthd_controller_breaker_open") == 1, 30,
                       "the breaker's gauge")

        assert fleet.jobs() == []
        for node in fleet.nodes:
            assert fleet.machines[node].resets() == [], node
            assert seen.verdicts(node) == ["PASS", "EVICT"], node  # kept out
            assert seen.events(node) == [("RepairHeld", 1)], node  # said once
        assert healthd.node(cordoned)["spec"]["unschedulable"] is True  # left as it was


def test_dry_run_decides_and_says_so_but_writes_nothing(healthd: Healthd,
                                                        tmp_path: Path) -> None:
    with repair_fleet(healthd, tmp_path, 1, config={"controller": {"dry_run": True}},
                      tag="dry") as fleet:
        (node,) = fleet.nodes
        replicas = fleet.kubelet.controllers()  # in dry run each acts, none leads
        with watching(fleet, [node]) as seen:
            fleet.remap_pending(node)
            for replica in replicas:
                eventually(lambda r=replica: r.sample(  # type: ignore[misc]
                    "healthd_controller_repairs_total", action="reset",
                    outcome="dry-run") == 1, HELD_S, "the reset decided and counted")
                assert f"dry run: node {node}: would reset-gpus" in \
                    replica.program.log.read_text()

        assert fleet.repair(node) is None and fleet.jobs() == []
        assert fleet.machines[node].resets() == []
        assert seen.states(node) == [None]  # no repair annotation, ever
        assert seen.events(node) == []
        assert seen.verdicts(node) == ["PASS", "EVICT"]
        annotations = healthd.node(node)["metadata"].get("annotations") or {}
        assert "healthd.io/run" not in annotations and "healthd.io/clear" not in annotations
