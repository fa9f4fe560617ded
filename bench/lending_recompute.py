"""lending_recompute: one node of a 10,000-node fleet changes -> the slack queue's
lendingLimits recomputed.

Uses the controller's own pure pieces, as a node event runs them: the node's
contribution (`health.unavailability`), the incremental `LendingModel.set_node`,
and `LendingModel.evaluate` of the slack queue (four flavors with nodeLabels, three
resources each). The fleet: 10,000 8-GPU nodes over two GPU models and four zones,
5 % of them already bad. Each sample flips one random node between PASS and EVICT.

Also reported, for scale: a flavor change (the model rebuilds its sums over every
bad node) and building the model from scratch from 10,000 Node objects (what a
new leader does once). Goal: one change recomputed in <= 50 ms (p99).

    python bench/lending_recompute.py            # 2,000 changes
    python bench/lending_recompute.py --quick    # 200
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from common import Goal, main, parser, summary

from healthd.capacity.health import unavailability
from healthd.capacity.lending import LendingModel
from healthd.kube.conventions import GPU_RESOURCE, Keys, Verdict

NAME = "lending_recompute"
NODES = 10_000
BAD_SHARE = 0.05
GOAL_MS = 50.0
KEYS = Keys()
BAD = frozenset({Verdict.ERR, Verdict.EVICT, Verdict.TESTING})
MODELS = ("h100", "a100")
ZONES = ("z1", "z2", "z3", "z4")
FLAVORS = {"default-flavor": {}, "h100": {"gpu": "h100"}, "a100": {"gpu": "a100"},
           "h100-z1": {"gpu": "h100", "zone": "z1"}}
Obj = dict[str, Any]


def node(i: int, verdict: str) -> Obj:
    capacity = {GPU_RESOURCE: "8", "cpu": "96", "memory": "1Ti", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:05d}",
                         "labels": {KEYS.gpuhealth: verdict, "gpu": MODELS[i % 2],
                                    "zone": ZONES[i % 4]}},
            "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}}


def slack_queue() -> Obj:
    def resources() -> list[Obj]:
        return [{"name": GPU_RESOURCE, "nominalQuota": "4000"},
                {"name": "cpu", "nominalQuota": "48000"},
                {"name": "memory", "nominalQuota": "500Ti"}]

    flavors = [{"name": name, "resources": resources()} for name in FLAVORS]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "slack-cluster-queue"},
            "spec": {"cohortName": "default-cohort", "resourceGroups": [
                {"coveredResources": [GPU_RESOURCE, "cpu", "memory"], "flavors": flavors}]}}


def contribution(obj: Obj) -> Any:
    return unavailability(obj, keys=KEYS, bad_verdicts=BAD)


def build(nodes: list[Obj]) -> LendingModel:
    model = LendingModel()
    model.set_flavors(FLAVORS)
    for obj in nodes:
        model.set_node(obj["metadata"]["name"], contribution(obj))
    return model


def one_change(model: LendingModel, queue: Obj, obj: Obj) -> int:
    """What a node event costs the lending side: contribution, delta, evaluation."""
    model.set_node(obj["metadata"]["name"], contribution(obj))
    return len(model.evaluate(queue))


def timed_ms(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1000


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    rng = random.Random(11)
    changes = 200 if args.quick else 2000
    verdicts = ["EVICT" if rng.random() < BAD_SHARE else "PASS" for _ in range(NODES)]
    nodes = [node(i, v) for i, v in enumerate(verdicts)]
    queue = slack_queue()
    scratch_ms = timed_ms(build, nodes)
    model = build(nodes)
    samples = []
    for _ in range(changes):
        i = rng.randrange(NODES)
        verdicts[i] = "PASS" if verdicts[i] == "EVICT" else "EVICT"
        samples.append(timed_ms(one_change, model, queue, node(i, verdicts[i])))
    flavors = dict(FLAVORS, extra={"zone": "z2"})
    rebuild_ms = timed_ms(model.set_flavors, flavors)
    figures: dict[str, Any] = {
        "nodes": NODES,
        "bad_nodes": len(model.bad_nodes),
        "limits_per_evaluation": len(model.evaluate(queue)),
        "one_change_ms": summary(samples),
        "flavor_change_rebuild_ms": round(rebuild_ms, 3),
        "from_scratch_ms": round(scratch_ms, 3),
    }
    return figures, {"one_change_p99_ms": Goal(figures["one_change_ms"]["p99"], GOAL_MS)}, [
        f"{changes} single-node changes (PASS <-> EVICT) on a {NODES}-node fleet, "
        f"{BAD_SHARE:.0%} bad; {len(FLAVORS)} flavors x 3 resources in the slack queue",
        "one change = health.unavailability + LendingModel.set_node + LendingModel.evaluate",
    ]


if __name__ == "__main__":
    sys.exit(main(NAME, measure, parser(__doc__.splitlines()[0]).parse_args()))
