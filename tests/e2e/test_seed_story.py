"""The seed story on the real programs: Kueue admits a `large` AppWrapper (4 pods x 4
GPUs) that the AppWrapper operator runs on kwok GPU nodes; XID 79 hits a GPU under it;
the agent labels that node EVICT; healthd resets the AppWrapper and the real operator
carries the reset out: the new pods land elsewhere (the real scheduler, the operator's
injected affinity). The slack queue's lendingLimit drops by the node's 8 GPUs and
Kueue really holds back a workload that would need them; the admin clears the repaired
node and everything comes back."""

from __future__ import annotations

import uuid

from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd, eventually
from tests.e2e.mlbatch import Workloads, appwrapper, tutorial

SLACK_GPUS = 16


def test_xid79_evicts_resets_moves_and_lends_honestly(healthd: Healthd, operator: Operator) -> None:
    workloads = Workloads(healthd.client)
    healthd.applier.apply(tutorial(team_gpus=8, slack_gpus=SLACK_GPUS))
    healthd.start_fleet("hgx", 5)
    suffix = uuid.uuid4().hex[:5]
    large = f"large-{suffix}"
    healthd.applier.apply([appwrapper(large, "blue", pods=4, gpus_per_pod=4)])
    eventually(lambda: len(workloads.running_nodes("blue", large)) == 4
               and workloads.phase("blue", large) == "Running", 120,
               "the large AppWrapper Running with 4 pods")
    first_nodes = workloads.running_nodes("blue", large)
    bad = first_nodes[0]
    old_pods = {p.metadata.uid for p in workloads.pods("blue", large)}
    assert workloads.lending_limit() is None  # nothing unavailable yet

    healthd.agents[bad].fault(op="emit_xid", gpu=3, code=79)
    eventually(lambda: healthd.label(bad) == "EVICT", 30, f"EVICT on {bad}")

    def moved() -> bool:
        pods = workloads.pods("blue", large)
        return (workloads.phase("blue", large) == "Running" and len(pods) == 4
                and not {p.metadata.uid for p in pods} & old_pods
                and all(p.status.phase == "Running" for p in pods))
    eventually(moved, 120, "the reset AppWrapper running again on new pods")
    assert bad not in workloads.running_nodes("blue", large)
    conditions = {c["type"]: c for c in
                  workloads.appwrapper("blue", large)["status"].get("conditions", [])}
    assert "Unhealthy" in conditions  # the reset left its reason behind

    eventually(lambda: workloads.lending_limit() == str(SLACK_GPUS - 8), 30,
               "lendingLimit lowered by the EVICT node's 8 GPUs")
    # red needs 16 GPUs: its own 8 and 8 borrowed, but blue already borrows the 8 the
    # slack queue may still lend: Kueue keeps red out.
    held = f"held-{suffix}"
    healthd.applier.apply([appwrapper(held, "red", pods=4, gpus_per_pod=4)])
    assert workloads.held_back("red", held, for_s=15), "Kueue admitted beyond real capacity"

    healthd.core.patch_node(bad, {"metadata": {"annotations": {"healthd.io/clear": "true"}}})
    eventually(lambda: healthd.label(bad) == "PASS", 60, f"{bad} PASS after the clear")
    eventually(lambda: workloads.lending_limit() is None, 30, "lendingLimit removed")
    eventually(lambda: workloads.admitted("red", held), 60, "the held workload admitted")
    eventually(lambda: len(workloads.running_nodes("red", held)) == 4, 120,
               "the held workload's 4 pods Running")
    healthd.applier.delete([appwrapper(held, "red", pods=4, gpus_per_pod=4),
                            appwrapper(large, "blue", pods=4, gpus_per_pod=4)])
